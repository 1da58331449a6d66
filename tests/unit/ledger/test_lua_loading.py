"""How the scripts are found, assembled and loaded: package resources, the prelude, EVALSHA after a Redis restart."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from importlib import resources

import pytest

from rollart.v1 import ledger_pb2 as lp
from rollart_ledger import policy as pol
from rollart_ledger.errors import LedgerError
from rollart_ledger.scripts import PRELUDE, SCRIPT_NAMES, LedgerScripts, source
from tests.conftest import REPO

LUA = resources.files("rollart_ledger") / "lua"


def lua_files() -> set[str]:
    return {p.name[: -len(".lua")] for p in LUA.iterdir() if p.name.endswith(".lua")}


def test_every_lua_file_is_a_script_with_a_wrapper_and_every_script_has_a_file():
    assert lua_files() == set(SCRIPT_NAMES) | {PRELUDE}
    for name in SCRIPT_NAMES:
        assert callable(getattr(LedgerScripts, name)), f"no LedgerScripts.{name}"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_file_opens_with_its_documentation(name):
    text = (LUA / f"{name}.lua").read_text()
    header = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        header.append(line)
    doc = "\n".join(header)
    assert header and header[0].startswith(f"-- {name}.lua: "), "first line names the file and what it does"
    assert "prelude.lua" in doc and "KEYS[1]" in doc, "says how it is loaded and what KEYS[1] is"
    assert "Returns" in doc, "says what it returns"


def test_source_is_the_prelude_with_the_policy_defaults_then_the_script():
    text = source("renew")
    prelude = (LUA / f"{PRELUDE}.lua").read_text()
    assert "__DEFAULTS__" not in text
    defaults = re.search(r"^local DEF = (\{.*\})$", text, re.M).group(1)
    for key, value in pol.DEFAULTS.items():
        assert f"{key} = {value!r}" in defaults
    assert text.startswith(prelude.split("local DEF =")[0])
    assert text.endswith((LUA / "renew.lua").read_text())
    with pytest.raises(KeyError):
        source("push_commands")


async def test_every_script_compiles_in_redis(blank):
    await blank.scripts.load()
    for name in SCRIPT_NAMES:
        sha = blank.scripts._scripts[name].sha
        assert (await blank.redis.script_exists(sha)) == [True]


async def test_scripts_are_loaded_again_after_redis_forgot_them(store):
    """A Redis restart empties the script cache: EVALSHA fails with NOSCRIPT and the wrapper loads and retries."""
    await store.ready_job()
    await store.redis.script_flush()
    leases = await store.acquire()
    assert len(leases) == 1
    # inside a MULTI (plan_commit) the pipeline loads missing scripts before it starts
    await store.redis.script_flush()
    async with store.redis.pipeline(transaction=True) as pipe:
        pipe.multi()
        await store.scripts.plan_commit(
            step=1, version=0, batch_size=2, plan=lp.StepPlan(step=1), quotas=[], tau_updates={}, commands=[], pipe=pipe
        )
        assert await pipe.execute() == [0]
    assert (await store.hash("cur"))["step"] == "1"


async def test_script_errors_become_ledger_errors_and_change_nothing(store):
    await store.policy(job="job-1")
    with pytest.raises(LedgerError) as exc:
        await store.policy(job="job-2")
    assert exc.value.code == "FAILED_PRECONDITION" and "job-1" in exc.value.message
    assert await store.get("job") == "job-1"


def test_a_wheel_ships_every_lua_file(tmp_path):
    """The Docker image installs the ledger as a normal (non-editable) package: the scripts must be in the wheel."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "services" / "ledger", src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    [wheel] = tmp_path.glob("rollart_ledger-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".lua")}
    assert shipped == {f"rollart_ledger/lua/{name}.lua" for name in lua_files()}


@pytest.mark.skipif(shutil.which("luacheck") is None, reason="luacheck is not installed (Debian: apt-get install lua-check)")
def test_luacheck_finds_nothing_in_any_assembled_script(tmp_path):
    """Static lint of each script as Redis runs it (prelude + body): no globals, no unused locals of its own, no
    shadowing. The prelude's helpers that a given script does not call are the only unused names allowed."""
    prelude = (LUA / f"{PRELUDE}.lua").read_text()
    shared = set(re.findall(r"^local function (\w+)", prelude, re.M))
    for names in re.findall(r"^local ([\w, ]+?) =", prelude, re.M):
        shared |= {n.strip() for n in names.split(",")}
    for name in SCRIPT_NAMES:
        (tmp_path / f"{name}.lua").write_text(source(name))
    argv = ["luacheck", "--std", "lua51", "--globals", "redis", "KEYS", "ARGV", "--no-max-line-length", "--no-color",
            "--codes", "--ignore", *[f"211/{n}" for n in sorted(shared)], "--", *sorted(str(p) for p in tmp_path.glob("*.lua"))]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-4000:]
