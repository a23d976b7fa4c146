"""Every code name the docs give resolves in the code (docs/*.md and README.md).

The docs name functions as ``module.function`` or ``module.Class.method`` relative to the ``securefed`` package
(docs/architecture.md, top), or ``Class.method`` for a class of the package. Each such name in inline code
(backticks, outside fenced blocks) must be importable / an attribute, a dataclass field or an attribute the class
sets on ``self`` — so that ``grep`` finds what the docs describe after the code has moved on. The docs must also
not cite files the repository does not ship (the design notes and paper files beside it)."""

import ast
import dataclasses
import functools
import glob
import importlib
import inspect
import os
import pkgutil
import re
import textwrap

import pytest

import securefed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]
SPAN = re.compile(r"`([^`\n]+)`")
NAME = re.compile(r"^(?:securefed\.)?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(\(.*\))?$")
FILE_SUFFIXES = {"json", "jsonl", "npy", "npz", "png", "csv", "html", "md", "py", "toml", "txt", "h5ad", "pem", "sh"}
PLACEHOLDERS = {"module.function", "module.Class.method"}


def _inline_names(path):
    """(name, its argument list or ""), e.g. ("federation.sums.secure_sum", "(co, task, label, …)")."""
    text = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
    for m in SPAN.finditer(text):
        n = NAME.match(m.group(1).strip())
        if n and n.group(1) not in PLACEHOLDERS and n.group(1).rsplit(".", 1)[1] not in FILE_SUFFIXES:
            yield n.group(1), n.group(2) or ""


def _parameters(args: str) -> list | None:
    """The items of a documented argument list ``(a, b=None, *, c, …)`` as (name, keyword) pairs — keyword: given
    with ``=`` or after a bare ``*`` — and "…" markers; None when the parentheses hold an expression rather than
    parameter names (then only the name is checked)."""
    out, keyword_only = [], False
    for item in (i.strip() for i in args[1:-1].split(",")):
        if item in ("…", "..."):
            out.append("…")
        elif item == "*":
            keyword_only = True
        elif item not in ("", "/"):
            name = item.split("=", 1)[0].strip().lstrip("*")
            if not name.isidentifier():
                return None
            out.append((name, keyword_only or "=" in item))
    return out


def check_signature(obj, args: str) -> str | None:
    """None when a documented argument list fits the callable; else why not.

    Every name must be a parameter; names without ``=`` must be its leading parameters in order (unless the list
    starts with ``…``); a list that starts with a bare name and holds no ``…`` is a whole signature and must name
    every parameter, in order (``f(a, b, …)`` leaves the rest out on purpose, ``f(key="v")`` shows one keyword)."""
    items = _parameters(args)
    if not items or not callable(obj):
        return None
    try:
        real = [p for p in inspect.signature(obj).parameters if p != "self"]
    except (TypeError, ValueError):
        return None
    names = [i[0] for i in items if i != "…"]
    why = f"documented as {args}, the code's parameters are ({', '.join(real)})"
    if any(n not in real for n in names):
        return why
    bare = [i[0] for i in items if i != "…" and not i[1]]
    if items[0] != "…" and real[: len(bare)] != bare:
        return why
    if "…" not in items and items[0] != "…" and not items[0][1] and names != real:
        return why + " (a whole signature must list every parameter, or end in …)"
    return None


@functools.cache
def _modules() -> dict:
    """Every module of the package by its dotted name relative to securefed ("" is the package)."""
    out = {"": securefed}
    for info in pkgutil.walk_packages(securefed.__path__, "securefed."):
        if info.name.endswith(".__main__"):  # runs the command line on import
            continue
        out[info.name[len("securefed.") :]] = importlib.import_module(info.name)
    return out


@functools.cache
def _classes() -> dict:
    """Class name → the classes of that name defined in the package."""
    out: dict = {}
    for mod in _modules().values():
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and obj.__module__ == mod.__name__:
                out.setdefault(name, []).append(obj)
    return out


def _self_attributes(cls) -> set:
    """Attributes a class (or a base in the package) assigns on ``self`` anywhere in its source."""
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith("securefed"):
            for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(klass)))):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                    and isinstance(node.ctx, ast.Store)
                ):
                    names.add(node.attr)
    return names


def _has(obj, attr: str) -> bool:
    if hasattr(obj, attr):
        return True
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj) and attr in {f.name for f in dataclasses.fields(obj)}:
            return True
        if any(attr in getattr(k, "__annotations__", {}) for k in obj.__mro__):
            return True
        return attr in _self_attributes(obj)
    return False


def resolve(name: str, args: str = "") -> str | None:
    """None when ``name`` resolves (and ``args``, a documented parameter list, matches); else why not. Names whose
    first part is neither a module of the package nor one of its classes (``os.urandom``,
    ``numpy.random.Generator``, ``co.release``) are not the package's: None."""
    parts = name.split(".")
    mods = _modules()
    for i in range(len(parts), 0, -1):  # the longest module prefix
        if ".".join(parts[:i]) in mods:
            obj, rest, where = mods[".".join(parts[:i])], parts[i:], "securefed." + ".".join(parts[:i])
            break
    else:
        classes = _classes().get(parts[0])
        if not classes:
            return None
        for obj in classes:
            if all(_has(o, a) for o, a in _walk(obj, parts[1:])):
                return check_signature(_target(obj, parts[1:]), args)
        return f"no class {parts[0]} of the package has {'.'.join(parts[1:])}"
    for o, a in _walk(obj, rest):
        if not _has(o, a):
            return f"{where} has no {'.'.join(rest)}"
    return check_signature(_target(obj, rest), args)


def _target(obj, attrs):
    for a in attrs:
        obj = getattr(obj, a, None)
    return obj


def _walk(obj, attrs):
    """Pairs (object, attribute) along a dotted path (stops at attributes that are not class members)."""
    for a in attrs:
        yield obj, a
        nxt = getattr(obj, a, None)
        if nxt is None:
            return
        obj = nxt


def _all_names():
    return sorted({(os.path.relpath(p, ROOT), n, a) for p in DOCS for n, a in _inline_names(p)})


def test_the_docs_name_code():
    assert len(_all_names()) > 100  # the extraction is not vacuous


def test_every_name_in_the_docs_resolves():
    bad = [f"{doc}: `{n}{a}` — {why}" for doc, n, a in _all_names() if (why := resolve(n, a))]
    assert not bad, "stale names in the docs:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "name, ok",
    [
        ("federation.coordinator.Coordinator.readmit", True),
        ("federation.coordinator.Coordinator._readmit", False),
        ("Coordinator.partial", True),
        ("Coordinator.nothing_here", False),
        ("landmarks.feddl.fed_dl", True),
        ("landmarks.feddl.fed_dll", False),
        ("RunResult.inventory", True),
        ("os.urandom", True),
        ("federation.sums.secure_sum(co, task, label, clip, weights=None, tap=None)", False),
        ("federation.sums.secure_sum(co, task, label, clip, …)", True),
        (
            "federation.sums.secure_sum(co, task, label, clip, weights=None, tap=None, "
            "integer_bits=None, *, out_shape, scales=None, binding=None)",
            True,
        ),
        ("federation.sums.secure_sum(co, task, clip, label)", False),
        ("federation.sums.secure_sum(co, task, label, clip, aggregator=None)", False),
        ("Coordinator.release(what, to=…, covered=…, note=…)", True),
    ],
)
def test_the_resolver_itself(name, ok):
    n = NAME.match(name)
    assert (resolve(n.group(1), n.group(2) or "") is None) == ok


UNSHIPPED = re.compile(r"DESIGN(?:\.md)?\s*§|papers/0\d\d|/work/shared|/work/scratch|\bREPORT\b")


def test_no_citation_of_files_the_repository_does_not_ship():
    hits = []
    for pattern in ("securefed/**/*.py", "benchmarks/*.py", "docs/*.md", "README.md", "BENCHMARKS.md", "tests/**/*.py"):
        for path in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            if os.path.abspath(path) == os.path.abspath(__file__):
                continue
            for i, line in enumerate(open(path, encoding="utf-8"), 1):
                if UNSHIPPED.search(line):
                    hits.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()[:100]}")
    assert not hits, "cites files a user cannot read (name the paper as docs/papers.md does):\n" + "\n".join(hits)
