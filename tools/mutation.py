"""Mutation testing of one module with only the tests that guard it (mutmut 3, a developer tool, not part of CI).

    tools/mutation.sh MODULE TESTS... [--functions GLOB,...] [--show]

MODULE is a file (spatial_jax/rl/dynamic_sampling.py, benchmarks/papers/paper_tables.py); TESTS are pytest paths or node
ids. The run works in a scratch copy of the tree under .mutation/<module>/ (mutmut writes its mutants/ beside the
sources it copies, so the worktree is never touched), mutates only MODULE, and runs each mutant against the TESTS that
reach the mutated function. --functions restricts the run and the count to functions whose names match the
comma-separated GLOBs (e.g. 'final_answer' or 'verdict,over_seeds'), for a module of which only part is under audit; a
mutant no selected test reaches counts as a survivor ("no tests"). It prints generated / killed / equivalent / survived;
equivalent mutants (ones no test can kill because they change no behaviour) are listed, each with one line of why, in
tools/mutation_equivalents.toml under the module's path, by mutmut's mutant name. A listed name that is no longer a
survivor is reported as stale, since mutmut numbers mutants per function and an edit of the function renumbers them.
"""

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = ROOT / "tools" / "mutation_equivalents.toml"
# what the tests read besides the two packages: configs, the ini (rootdir and markers), tools the tests run
COPIED = ["spatial_jax", "benchmarks", "tests", "tools", "configs", "checkpoints", "pytest.ini", "setup.py"]
KILLED = {"killed", "timeout", "segfault", "caught by type check"}


def mutant_function(name: str) -> str:
    """The function a mutmut name mutates: 'pkg.mod.x_fn__mutmut_3' -> 'fn', 'pkg.mod.xǁCǁm__mutmut_1' -> 'C.m'."""
    last = name.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]
    return last.removeprefix("x_") if not last.startswith("xǁ") else ".".join(last.split("ǁ")[1:])


def write_config(work: Path, target: str, tests: list[str]) -> None:
    lines = [
        "[mutmut]",
        "source_paths =\n" + "\n".join(f"    {p}" for p in dict.fromkeys(["spatial_jax", target.split("/")[0]])),
        f"only_mutate =\n    {target}",
        # the ini's addopts name xdist's --dist: dropped, so each mutant runs in one process (-p no:xdist)
        "pytest_add_cli_args =\n    -o\n    addopts=\n    -p\n    no:xdist\n    -p\n    no:cacheprovider\n    -q",
        "pytest_add_cli_args_test_selection =\n" + "\n".join(f"    {t}" for t in tests),
        "also_copy =\n" + "\n".join(f"    {p}" for p in COPIED if p not in ("spatial_jax", target.split("/")[0])),
        # jax and torch start threads: workers fork from a server that only imported them, not ran them
        "process_isolation = forkserver",
        "use_git_change_detection = false",
    ]
    (work / "setup.cfg").write_text("\n".join(lines) + "\n")


def results(work: Path, target: str) -> dict[str, str]:
    from mutmut.stats import status_by_exit_code

    meta = json.loads((work / "mutants" / (target + ".meta")).read_text())
    return {name: status_by_exit_code[code] for name, code in meta["exit_code_by_key"].items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module")
    parser.add_argument("tests", nargs="+")
    parser.add_argument("--functions", default="*",
                        help="count only mutants of functions matching these globs (comma-separated)")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--show", action="store_true", help="print the diff of every survivor")
    parser.add_argument("--survivors", action="store_true",
                        help="rerun the last run's survivors only, against the tests as now (tests only added)")
    args = parser.parse_args(argv)
    module = Path(args.module).as_posix()
    if not (ROOT / module).is_file():
        parser.error(f"{module}: no such file")

    work = ROOT / ".mutation" / module.replace("/", "_").removesuffix(".py")
    # the tests import a benchmark as a top-level module (its folder, e.g. benchmarks/papers, on sys.path) and mutmut
    # names a mutant by its import path, which for a file under src/ drops the "src.": the benchmark's folder is
    # mutated there, so that `import learning` reaches "learning.x_verdict__mutmut_1"
    target = "src/" + Path(module).name if module.startswith("benchmarks/") else module
    # a package's __init__.py is named by the package ("spatial_jax.data.sources.x_spec_digest__mutmut_1")
    dotted = target.removeprefix("src/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    globs = args.functions.split(",")
    names = [] if globs == ["*"] else [f"{dotted}.x*{g.split('.')[-1]}__mutmut_*" for g in globs]

    def audited(name: str) -> bool:
        return any(fnmatch.fnmatch(mutant_function(name), g) for g in globs)

    if args.survivors:
        # mutmut reruns the mutants it is named and keeps every other result: only the tests are refreshed
        if not (work / target).is_file() or (work / target).read_bytes() != (ROOT / module).read_bytes():
            parser.error(f"{module} changed since its last run (or has none): run it in full")
        for dest in (work / "tests", work / "mutants" / "tests"):
            shutil.copytree(ROOT / "tests", dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        write_config(work, target, args.tests)
        listed = tomllib.loads(EQUIVALENTS.read_text()).get(module, {}) if EQUIVALENTS.is_file() else {}
        saved = work / "statuses.json"  # the last run's statuses, kills kept across --survivors runs
        before = json.loads(saved.read_text()) if saved.is_file() else results(work, target)
        names = [n for n, s in before.items() if s not in KILLED and audited(n) and n not in listed]
    else:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        for name in COPIED:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__", "out", "runs"))
            elif src.is_file():
                shutil.copy2(src, work / name)
        if target != module:
            shutil.copytree((ROOT / module).parent, work / "src", ignore=shutil.ignore_patterns("__pycache__", "out"))
        write_config(work, target, args.tests)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tests must import the mutated copy
    log = work / "mutmut.log"
    rc = 0
    if names or not args.survivors:
        with open(log, "w") as out:
            rc = subprocess.run(
                [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children), *names],
                cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
            ).returncode
    if rc != 0 or not (work / "mutants" / (target + ".meta")).is_file():
        print(log.read_text()[-4000:])
        print(f"mutation: mutmut failed (exit {rc}); log {log}", file=sys.stderr)
        return 1

    every = results(work, target)
    if args.survivors:  # mutmut may drop cached results when the tests change: the last run's kills stand
        every.update({n: s for n, s in before.items() if n not in names})
    (work / "statuses.json").write_text(json.dumps(every, indent=0, sort_keys=True))
    status = {n: s for n, s in every.items() if audited(n)}
    listed = tomllib.loads(EQUIVALENTS.read_text()).get(module, {}) if EQUIVALENTS.is_file() else {}
    survived = sorted(n for n, s in status.items() if s not in KILLED)
    equivalent = [n for n in survived if n in listed]
    stale = sorted(n for n in listed if n not in survived and audited(n))
    killed = sum(s in KILLED for s in status.values())
    live = [n for n in survived if n not in listed]
    rate = killed / max(len(status) - len(equivalent), 1)
    print(f"{module} [{args.functions}]: generated {len(status)}  killed {killed}  equivalent {len(equivalent)}  "
          f"survived {len(live)}  kill rate {100 * rate:.1f}% (equivalents excluded)")
    for n in live:
        print(f"  survived ({status[n]}): {n}")
        if args.show:
            diff = subprocess.run([sys.executable, "-m", "mutmut", "show", n], cwd=work, env=env,
                                  capture_output=True, text=True).stdout
            print("\n".join("      " + line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in
                            ("+++", "---")))
    for n in stale:
        print(f"  stale equivalent entry (not a survivor now): {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
