"""Repository rules that keep Bazel offline: local rule sets, a coverage stand-in, a .venv toolchain.

Bazel 4's built-in packages that toolchain resolution loads (@bazel_tools//tools/cpp and
//tools/jdk, the autoconfigured C++ toolchain) load `@rules_cc//cc:defs.bzl` and
`@rules_java//java:defs.bzl`; Bazel's default WORKSPACE suffix would download those rule sets for
that. What these files give is Bazel's native rules under their own names, so `native_rules`
writes such forwarding macros (nothing is downloaded or copied). Every test rule also names
@remote_coverage_tools (another download), used only by `bazel coverage`: a stand-in says so.
`venv_python` points the Python toolchain at `<workspace>/.venv/bin/python`, the interpreter with
the pinned requirements, by its absolute path (not resolved: the venv's site-packages follow it).
"""

# The native rules that rules_cc and rules_java re-export (the names Bazel's own BUILD files load).
CC_RULES = [
    "cc_binary",
    "cc_import",
    "cc_library",
    "cc_proto_library",
    "cc_test",
    "cc_toolchain",
    "cc_toolchain_suite",
    "fdo_prefetch_hints",
    "fdo_profile",
    "objc_import",
    "objc_library",
]

JAVA_RULES = [
    "java_binary",
    "java_import",
    "java_library",
    "java_lite_proto_library",
    "java_package_configuration",
    "java_plugin",
    "java_proto_library",
    "java_runtime",
    "java_test",
    "java_toolchain",
]

def _native_rules_impl(rctx):
    package = rctx.attr.package
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("BUILD", "")
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    if rctx.attr.toolchain_type:
        build.append('alias(name = "toolchain_type", actual = "%s")' % rctx.attr.toolchain_type)
    rctx.file(package + "/BUILD", "\n".join(build) + "\n")
    rctx.file(package + "/defs.bzl", "\n".join(
        ['"""Bazel\'s native rules under the names @%s//%s:defs.bzl gives them."""' % (rctx.name, package), ""] +
        ["def {0}(**attrs):\n    native.{0}(**attrs)\n".format(rule) for rule in rctx.attr.rules],
    ))

native_rules = repository_rule(
    implementation = _native_rules_impl,
    attrs = {
        "package": attr.string(mandatory = True, doc = "the package holding defs.bzl, e.g. cc"),
        "rules": attr.string_list(mandatory = True, doc = "native rules defs.bzl forwards to"),
        "toolchain_type": attr.string(doc = "what <package>:toolchain_type aliases, if anything"),
    },
    doc = "A rule set written locally: defs.bzl forwards each named rule to the native one.",
)

_PYTHON_BUILD = """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "python3",
    interpreter_path = "{python}",
    python_version = "PY3",
    stub_shebang = "#!{python}",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":python3",
)

toolchain(
    name = "toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)

exports_files(
    ["requirements.txt"],
    visibility = ["//visibility:public"],
)
"""

# The pins .venv is installed from (launch/setup.sh); not the TPU extras, which CPU hosts lack.
_PINS = ["@//:requirements.txt", "@//:requirements-test.txt"]

def _venv_python_impl(rctx):
    workspace = rctx.path(Label("@//:WORKSPACE")).dirname
    python = "%s/.venv/bin/python" % workspace
    if not rctx.path(python).exists:
        fail("%s does not exist: run `bash launch/setup.sh` first (it makes the virtualenv with " % python +
             "the pinned requirements that Bazel's Python toolchain uses)")
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("BUILD", _PYTHON_BUILD.format(python = python))

    # Reading the pins through labels also refetches this repository when they change.
    rctx.file("requirements.txt", "".join([rctx.read(rctx.path(Label(pin))) for pin in _PINS]))

venv_python = repository_rule(
    implementation = _venv_python_impl,
    local = True,
    doc = "A Python toolchain whose interpreter is the workspace's .venv/bin/python; its pins.",
)

_NO_COVERAGE = """\
#!/bin/sh
echo "bazel coverage needs Bazel's coverage tools (@remote_coverage_tools, a download from" >&2
echo "mirror.bazel.build); this workspace is offline, so they are not there." >&2
exit 1
"""

def _coverage_tools_unavailable_impl(rctx):
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("unavailable.sh", _NO_COVERAGE, executable = True)
    rctx.file("BUILD", "\n".join([
        'package(default_visibility = ["//visibility:public"])',
        "",
        'sh_binary(name = "coverage_report_generator", srcs = ["unavailable.sh"])',
        "",
        'sh_binary(name = "lcov_merger", srcs = ["unavailable.sh"])',
        "",
    ]))

coverage_tools_unavailable = repository_rule(
    implementation = _coverage_tools_unavailable_impl,
    doc = "Stands in for @remote_coverage_tools: every test rule names it; running it says why not.",
)
