"""An offline NLTK "words" corpus built from the ``english-words`` package (word games need it).

NLTK's corpus has two lists: ``en`` (a large dictionary; here web2) and ``en-basic`` (850 basic words; here the
words of 3 to 8 letters found in both web2 and GCIDE, a larger but still common-word list). ``nltk.download``
is replaced by a no-op afterwards: the games call it on construction and would otherwise try the network.
"""

from __future__ import annotations

import os
import tempfile
import threading

_lock = threading.Lock()
_done: str | None = None


def corpus_dir() -> str:
    return os.environ.get("ROLLART_NLTK_DATA") or os.path.join(tempfile.gettempdir(), "rollart-nltk-data")


def prepare_offline_words() -> str:
    """Writes the corpus once (per directory) and points NLTK at it; returns the data directory."""
    global _done
    with _lock:
        root = corpus_dir()
        if _done == root:
            return root
        words_dir = os.path.join(root, "corpora", "words")
        if not os.path.exists(os.path.join(words_dir, "en-basic")):
            from english_words import get_english_words_set

            web2 = get_english_words_set(["web2"], alpha=True, lower=True)
            gcide = get_english_words_set(["gcide"], alpha=True, lower=True)
            basic = sorted(w for w in web2 & gcide if 3 <= len(w) <= 8)
            os.makedirs(words_dir, exist_ok=True)
            for name, items in (("en", sorted(web2)), ("en-basic", basic)):
                fd, tmp = tempfile.mkstemp(dir=words_dir)
                with os.fdopen(fd, "w") as f:
                    f.write("\n".join(items) + "\n")
                os.replace(tmp, os.path.join(words_dir, name))
            with open(os.path.join(words_dir, "README"), "w") as f:
                f.write("Built by rollart_envmanager from the english-words package (web2, gcide).\n")
        import nltk

        if root not in nltk.data.path:
            nltk.data.path.insert(0, root)
        nltk.download = _no_download
        _done = root
        return root


def _no_download(*args: object, **kwargs: object) -> bool:
    return True
