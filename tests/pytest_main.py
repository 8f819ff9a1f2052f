"""Bazel's entry point for every py_test (launch/bazel/pytest.bzl): pytest over the given files.

The files run from their real paths in the checkout, as under launch/test.sh: Bazel's runfiles are
symlinks into the checkout, and the task loaders (rightly) refuse task files that link out of
their directory, so tests that find fixtures next to `__file__` need the real tree. `tr` itself is
still imported from the runfiles, where only the modules BUILD declares exist.

Bazel's test protocol: `--test_filter` arrives as $TESTBRIDGE_TEST_ONLY (used as pytest's -k), and
a JUnit report written to $XML_OUTPUT_FILE gives Bazel the individual test cases.
"""

import os
import pathlib
import sys

import pytest


def pytest_args(files, environ, rootdir):
    """The pytest command line for `files` under Bazel's test environment `environ`."""
    args = ["-q", "-p", "no:cacheprovider", f"--rootdir={rootdir}", *files]
    if environ.get("XML_OUTPUT_FILE"):
        args.append(f"--junitxml={environ['XML_OUTPUT_FILE']}")
    if environ.get("TESTBRIDGE_TEST_ONLY"):
        args += ["-k", environ["TESTBRIDGE_TEST_ONLY"]]
    return args


def real_paths(files):
    """(the files' real paths, the checkout holding them); `files` are relative to the runfiles root."""
    real = [pathlib.Path(f).resolve() for f in files]
    checkout = real[0].parents[len(pathlib.Path(files[0]).parts) - 1]
    return [str(p) for p in real], str(checkout)


if __name__ == "__main__":
    test_files, root = real_paths(sys.argv[1:])
    sys.exit(pytest.main(pytest_args(test_files, os.environ, root)))
