"""The stdlib check runner: pytest's check semantics without pytest's start-up (~0.3 s a run).

    "$TR_PYTHON" -I -S /opt/tr/verifier/checkrun.py --junitxml=/logs/verifier/junit.xml FILE...

A task selects it with `[verifier] runner = "stdlib"` in task.toml.  The protected verifier runs it
exactly where it runs pytest: the harness mounts this file read-only at /opt/tr/verifier
(tr.envs.protected.FILES), the tests at /tests; `-I -S` (isolated, no `site`) keeps every path the
agent can write -- the cwd, PYTHON* variables, site-packages, sitecustomize -- out of the
interpreter, whose `sys.path` is then the read-only standard library only.

What it runs, as pytest would collect it: every top-level function `test*` of each file, and every
method `test*` of each top-level class `Test*` (a fresh instance per test).  A check passes when it
returns, fails on any exception; a function that takes arguments (pytest fixtures) is an error.  A
file that cannot be imported is one error case named after the file (pytest's "collection
failure").  The report is JUnit XML in pytest's xunit1 form, so `tr.envs.verifier` scores both
alike.  Exit status: 0 all passed, 1 some failed, 5 nothing collected (pytest's codes).

Stdlib only, self-contained: it must run in a bare interpreter.
"""

import hashlib
import importlib.util
import inspect
import json
import os
import sys
import time
import traceback
import xml.etree.ElementTree as ET


def _load(path):
    stem = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module
    spec.loader.exec_module(module)
    return stem, module


def collect(module):
    """(class name or "", test name, callable) in definition order."""
    items = []
    for name, obj in list(vars(module).items()):
        if inspect.isfunction(obj) and name.startswith("test"):
            items.append(("", name, obj))
        elif inspect.isclass(obj) and name.startswith("Test") and "__init__" not in vars(obj):
            for attr, fn in vars(obj).items():
                if inspect.isfunction(fn) and attr.startswith("test"):
                    items.append((name, attr, (obj, attr)))
    return items


def run_one(target):
    """('passed' | 'failed' | 'error', message)."""
    if isinstance(target, tuple):
        klass, attr = target
        fn = getattr(klass(), attr)
    else:
        fn = target
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.default is inspect.Parameter.empty
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if params:
        return "error", (f"fixture {params[0].name!r} not found: the stdlib runner has no "
                         "fixtures (use runner = \"pytest\")")
    try:
        fn()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any exception fails the check, as in pytest
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return "failed", text[:2000]
    return "passed", ""


def _report_collected(loaded):
    """What was collected, as the harness's pytest plugin reports it (tr.envs.protected): node
    ids relative to $TEST_DIR in $TR_COLLECTED, their count and digest on stdout."""
    root = os.environ.get("TEST_DIR", "/tests")
    ids = sorted("::".join([os.path.relpath(path, root), *([klass] if klass else []), name])
                 for path, _, tests in loaded for klass, name, _ in tests)
    text = json.dumps(ids)
    target = os.environ.get("TR_COLLECTED")
    if target:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        with open(target, "w") as f:
            f.write(text)
    print(f"\n[tr-collected] {len(ids)} {hashlib.sha256(text.encode()).hexdigest()}", flush=True)


def main(argv):
    junit, files = None, []
    for arg in argv:
        if arg.startswith("--junitxml="):
            junit = arg.split("=", 1)[1]
        else:
            files.append(arg)
    if junit is None or not files:
        sys.stderr.write("usage: checkrun.py --junitxml=PATH FILE...\n")
        return 4
    suite = ET.Element("testsuite", name="checkrun")
    counts = {"passed": 0, "failed": 0, "error": 0}
    loaded = []                       # (path, stem, tests) -- every file collected first
    for path in files:
        try:
            stem, module = _load(path)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001
            stem = os.path.splitext(os.path.basename(path))[0]
            case = ET.SubElement(suite, "testcase", classname="", name=f"tests.{stem}", time="0")
            ET.SubElement(case, "error", message="collection failure").text = (
                "".join(traceback.format_exception_only(type(exc), exc))[:2000])
            counts["error"] += 1
            print(f"ERROR {path} (collection failure): {exc!r}")
            continue
        loaded.append((path, stem, collect(module)))
    _report_collected(loaded)
    for path, stem, tests in loaded:
        for klass, name, target in tests:
            start = time.perf_counter()
            outcome, message = run_one(target)
            counts[outcome] += 1
            classname = f"{stem}.{klass}" if klass else stem
            case = ET.SubElement(suite, "testcase", classname=classname, name=name, file=path,
                                 time=f"{time.perf_counter() - start:.4f}")
            if outcome != "passed":
                tag = "failure" if outcome == "failed" else "error"
                ET.SubElement(case, tag, message=message.splitlines()[0][:500] if message else tag
                              ).text = message
            label = f"{classname}::{name}" if klass else f"{stem}::{name}"
            print(f"{outcome.upper():6} {label}" + (f": {message.splitlines()[-1][:200]}"
                                                   if message else ""))
    total = sum(counts.values())
    suite.set("tests", str(total))
    suite.set("failures", str(counts["failed"]))
    suite.set("errors", str(counts["error"]))
    root = ET.Element("testsuites")
    root.append(suite)
    os.makedirs(os.path.dirname(junit) or ".", exist_ok=True)
    ET.ElementTree(root).write(junit, encoding="utf-8", xml_declaration=True)
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['error']} errors")
    if total == 0:
        return 5
    return 0 if counts["passed"] == total else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
