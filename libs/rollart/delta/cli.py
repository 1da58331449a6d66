"""``rollart delta encode|apply|inspect``.

    rollart delta encode --base A.safetensors --target B.safetensors --out D.dseg --job J --version V
                         [--base-version U] [--base-hash H] [--format-version {1,2,3}] [--key-file K]
                         [--max-segment-bytes N] [--no-fuse] [--json]
    rollart delta apply --base A.safetensors --delta D.dseg --out C.safetensors [--key-file K]
                        [--base-version U] [--base-hash H|content] [--json]
    rollart delta inspect D.dseg [--json] [--key-file K] [--base A.safetensors [--base-version U]
                          [--base-hash H|content]]

The job key is the content of --key-file (leading/trailing ASCII whitespace removed), else the
environment variable ROLLART_JOB_KEY (UTF-8). ``inspect`` runs every check ``apply`` runs, through the same
code (so a fault gives the same error class in both); it verifies HMACs only when a key is available and
checks the delta against a base only with --base, and it lists what it did not check.

The base's identity (version and, for format versions 2 and 3, its hash h(v-1)) comes from the file's RollArt
metadata (``rollart.version``, ``rollart.hash``). A file without it is refused as a base unless
--base-version and (formats 2, 3) --base-hash are given: a hex hash, or ``content`` for the digest of the file's
tensors (the identity of weights that no delta produced, such as a job's first version).
Exit status: 0 success, 1 the delta or a file was rejected, 2 usage error.
Also runnable as ``python -m rollart.delta.cli [delta] encode ...``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .codec import TARGET_CHECKS, Delta, DeltaEncoder, apply_delta, decode_delta, inspect_delta
from .errors import BaseMismatchError, DeltaError
from .identity import digest_matches, weights_digest
from .names import ParamMap
from .safetensors_io import JOB_KEY, WeightSet, load_safetensors, save_safetensors
from .segment import DEFAULT_MAX_SEGMENT_BYTES, FORMAT_VERSION, SUPPORTED_VERSIONS

KEY_ENV = "ROLLART_JOB_KEY"


class UsageError(Exception):
    pass


def load_key(key_file: str | None, required: bool = True) -> bytes | None:
    if key_file:
        try:
            key = Path(key_file).read_bytes().strip()
        except OSError as e:
            raise UsageError(f"cannot read key file {key_file}: {e.strerror}") from None
        if not key:
            raise UsageError(f"key file {key_file} is empty")
        return key
    env = os.environ.get(KEY_ENV, "")
    if env:
        return env.encode("utf-8")
    if required:
        raise UsageError(f"no job key: pass --key-file or set {KEY_ENV}")
    return None


def _map(path: str) -> memoryview:
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return memoryview(b"")
            return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None


def _emit(args: argparse.Namespace, summary: dict[str, Any], line: str) -> None:
    print(json.dumps(summary, indent=2) if getattr(args, "json", False) else line)


def _hash_arg(value: str | None) -> bytes | None:
    if value is None or value == "content":
        return None
    try:
        h = bytes.fromhex(value)
    except ValueError:
        h = b""
    if len(h) != 32:
        raise UsageError(f"--base-hash must be 64 hex digits or 'content', got {value!r}")
    return h


def _identify_base(args: argparse.Namespace, weights: WeightSet, delta: Delta) -> None:
    """Set the base's version and hash from its metadata or the caller's flags (refusing what is unknown)."""
    if args.base_version is not None:
        if weights.version is not None and weights.version != args.base_version:
            raise UsageError(f"--base-version {args.base_version} but {args.base} records {weights.version}")
        weights.version = args.base_version
    elif weights.version is None:
        raise BaseMismatchError(
            f"{args.base} records no RollArt version: pass --base-version (and, format 2 or 3, --base-hash)"
        )
    if delta.base_hash is None or weights.version == delta.version:
        return  # format 1 names no base hash; at the delta's version the delta's own h(v) is what counts
    given = _hash_arg(args.base_hash)
    if args.base_hash == "content":
        given = weights_digest(weights.arrays, weights.dtypes)
        if given != delta.base_hash and digest_matches(weights.arrays, weights.dtypes, delta.base_hash):
            given = delta.base_hash  # the legacy digest of weights holding a 0-d tensor (identity.py)
    if given is not None:
        if weights.applied_hash is not None and weights.applied_hash != given:
            raise UsageError(f"--base-hash {given.hex()} but {args.base} records {weights.applied_hash.hex()}")
        weights.applied_hash = given
    elif weights.applied_hash is None:
        raise BaseMismatchError(
            f"{args.base} records no RollArt hash: pass --base-hash (hex, or 'content' for weights no delta produced)"
        )


def cmd_encode(args: argparse.Namespace) -> int:
    key = load_key(args.key_file)
    assert key is not None
    t0 = time.perf_counter()
    base = load_safetensors(args.base)
    target = load_safetensors(args.target)
    pm = ParamMap.from_weights(base, fuse=not args.no_fuse)
    enc = DeltaEncoder(
        base,
        target,
        job=args.job,
        version=args.version,
        base_version=args.base_version,
        key=key,
        max_segment_bytes=args.max_segment_bytes,
        param_map=pm,
        format_version=args.format_version,
        base_hash=_hash_arg(args.base_hash),
    )
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.writelines(enc.segments())  # written as produced: memory stays at one tensor's delta
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    w = enc.writer
    assert w.hash is not None
    summary = {
        "out": str(out),
        "job": args.job,
        "version": w.version,
        "base_version": w.base_version,
        "format_version": w.format_version,
        "base_hash": w.base_hash.hex() if w.base_hash else None,
        "segments": w.segment_count + 1,
        "entries": w.total_entries,
        "total_bytes": w.total_bytes,
        "hash": w.hash.hex(),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    _emit(
        args,
        summary,
        f"wrote {out}: version {w.version} (base {w.base_version}), {w.total_entries} entries, "
        f"{w.segment_count + 1} segments, {w.total_bytes} bytes, h(v)={w.hash.hex()}",
    )
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    key = load_key(args.key_file)
    assert key is not None
    t0 = time.perf_counter()
    delta = decode_delta(_map(args.delta), key)
    weights = load_safetensors(args.base, writable=True)
    _identify_base(args, weights, delta)
    changed = apply_delta(delta, weights)  # the naming (fused or --no-fuse) follows the delta's tensor names
    weights.metadata[JOB_KEY] = delta.job
    save_safetensors(args.out, weights)
    summary = {
        "out": str(args.out),
        "version": delta.version,
        "base_version": delta.base_version,
        "format_version": delta.format_version,
        "entries": delta.total_entries,
        "tensors": len(delta.tensors),
        "hash": delta.hash.hex(),
        "already_applied": not changed,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    _emit(
        args,
        summary,
        f"wrote {args.out}: version {delta.version} from {delta.base_version}, {delta.total_entries} entries "
        f"in {len(delta.tensors)} tensors" + ("" if changed else " (already at this version: unchanged)"),
    )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    key = load_key(args.key_file, required=False)
    data = _map(args.delta)
    base = None
    if args.base:
        base = load_safetensors(args.base, writable=True)  # copy-on-write: the writability check passes, no write
        _identify_base(args, base, decode_delta(data, key))
    info = inspect_delta(data, key, base)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(
        f"job {info['job']}  version {info['version']}  base {info['base_version']}  format {info['format_version']}  "
        f"segments {info['segments']} ({info['dense_segments']} dense)  entries {info['entries']}  "
        f"bytes {info['total_bytes']} (index {info['index_bytes']}, values {info['value_bytes']})  "
        f"authenticated {info['authenticated']}\nh(v) {info['hash']}\nh(v-1) {info['base_hash'] or '(format 1: none)'}"
    )
    print("verified: every check apply runs on the delta itself" + (" and on --base" if base is not None else ""))
    for what in info["not_checked"]:
        print(f"NOT checked: {what}")
    tensors: list[dict[str, Any]] = info["tensors"]
    width = max((len(t["name"]) for t in tensors), default=4)
    print(f"{'tensor':<{width}}  {'dtype':<7} {'entries':>10} {'segments':>8} {'index_bytes':>11} {'B/entry':>7}")
    for t in tensors:
        per = (t["index_bytes"] + t["value_bytes"]) / t["entries"]
        print(
            f"{t['name']:<{width}}  {t['dtype']:<7} {t['entries']:>10} {t['segments']:>8} "
            f"{t['index_bytes']:>11} {per:>7.2f}"
        )
    return 0


def _run(handler: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(handler(args))
        except UsageError as e:
            print(f"rollart delta: error: {e}", file=sys.stderr)
            return 2
        except DeltaError as e:
            print(f"rollart delta: rejected ({type(e).__name__}): {e}", file=sys.stderr)
            return 1
        except (ValueError, OSError) as e:
            print(f"rollart delta: error: {e}", file=sys.stderr)
            return 1

    return wrapped


def _base_identity_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-version", type=int, default=None, help="version of --base if it records none")
    p.add_argument(
        "--base-hash",
        help="h(v-1) of --base if it records none: 64 hex digits, or 'content' (digest of its tensors)",
    )


def add_subparsers(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``delta`` (with encode, apply, inspect) on an argparse subparsers object."""
    delta = subparsers.add_parser("delta", help="sparse delta checkpoints: encode, apply, inspect")
    sub = delta.add_subparsers(dest="delta_command", metavar="{encode,apply,inspect}", required=True)

    p = sub.add_parser("encode", help="extract and encode the delta between two safetensors checkpoints")
    p.add_argument("--base", required=True, help="version v-1 (safetensors)")
    p.add_argument("--target", required=True, help="version v (safetensors)")
    p.add_argument("--out", required=True, help="delta file to write (.dseg)")
    p.add_argument("--job", required=True, help="job id")
    p.add_argument("--version", required=True, type=int, help="version v of the target")
    p.add_argument("--base-version", type=int, default=None, help="version of the base (default v-1)")
    p.add_argument(
        "--base-hash",
        help="h(v-1) of the base, 64 hex digits (formats 2, 3; default: the base's rollart.hash, else its digest)",
    )
    p.add_argument("--format-version", type=int, choices=SUPPORTED_VERSIONS, default=FORMAT_VERSION)
    p.add_argument("--key-file", help=f"job key file (default: ${KEY_ENV})")
    p.add_argument("--max-segment-bytes", type=int, default=DEFAULT_MAX_SEGMENT_BYTES)
    p.add_argument("--no-fuse", action="store_true", help="keep HF names (no qkv_proj/gate_up_proj)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_run(cmd_encode))

    p = sub.add_parser("apply", help="apply a delta to its base checkpoint, writing the new version")
    p.add_argument("--base", required=True, help="checkpoint at the delta's base version (safetensors)")
    p.add_argument("--delta", required=True, help="delta file (.dseg)")
    p.add_argument("--out", required=True, help="checkpoint to write (safetensors)")
    p.add_argument("--key-file", help=f"job key file (default: ${KEY_ENV})")
    _base_identity_args(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_run(cmd_apply))

    p = sub.add_parser(
        "inspect",
        help="verify a delta file with every check apply runs, and summarise it",
        description="Runs every check apply runs on the delta (same code, same error classes). Not checked, "
        "and said so in the output: HMACs without a job key; the base checks ("
        + "; ".join(TARGET_CHECKS)
        + ") without --base.",
    )
    p.add_argument("delta", help="delta file (.dseg)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--key-file", help=f"also verify HMACs with this key (default: ${KEY_ENV} if set)")
    p.add_argument("--base", help="also check the delta against this base checkpoint (nothing is written)")
    _base_identity_args(p)
    p.set_defaults(func=_run(cmd_inspect))
    return delta


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollart")
    add_subparsers(parser.add_subparsers(dest="command", required=True))
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] != ["delta"] and args_list[:1] not in (["-h"], ["--help"]):
        args_list.insert(0, "delta")  # `python -m rollart.delta.cli encode ...` works too
    args = parser.parse_args(args_list)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
