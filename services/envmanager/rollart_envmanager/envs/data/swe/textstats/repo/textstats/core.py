"""Text statistics."""


def words(text):
    return text.split(" ")


def word_count(text):
    """Number of words in text."""
    if not text:
        return 0
    return len(words(text))


def line_count(text):
    """Number of lines (a trailing newline does not start a new line)."""
    if not text:
        return 0
    return len(text.rstrip("\n").split("\n"))


def average_word_length(text):
    ws = [w for w in words(text) if w]
    if not ws:
        return 0.0
    return sum(len(w) for w in ws) / len(ws)
