#!/usr/bin/env python3
"""Render a Helm chart without helm: a small, strict subset of Go templates.

helm is not installable from the package registries this project can reach,
so CI renders deploy/helm/gap-healer with this script and validates the
output (kubernetes-validate, checkov, promtool, TOML parse). It mimics
`helm template` for the constructs the chart uses and FAILS on anything
else (unknown function, unknown keyword, missing .Values key with --strict),
so a template that this renderer cannot render faithfully is an error, never
a silent pass.

Supported: text, {{- -}} trimming, {{/* comments */}}, if/else if/else/end,
with/else/end, range (list or map, `$k, $v :=`), define + include, variable
declaration and assignment, parenthesised pipelines, field chains on ., $ and
$var, .Files.Get, string/number/bool literals, and the functions listed in
FUNCS below. Values behave as in Helm: numbers from YAML are float64, so
`{{ .Values.n }}` of 1000000 renders as 1e+06 just as helm does (use `int`).

Usage:
  helm_render.py CHART_DIR [--release NAME] [--namespace NS]
                 [-f values.yaml]... [--set a.b=value]... [--strict]
Prints the rendered manifests to stdout as `helm template` does.
"""

import argparse
import base64
import copy
import hashlib
import json
import math
import os
import re
import sys

import yaml


class TemplateError(Exception):
    pass


# ---------------------------------------------------------------- Go values

class GoFloat(float):
    """A number that came from YAML values: Helm holds these as float64."""

    def __str__(self):
        return go_format_float(self)

    __repr__ = __str__


def go_format_float(f):
    """strconv.FormatFloat(f, 'g', -1, 64): what Go's %v prints for float64."""
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if f != f:
        return "NaN"
    if f == 0:
        return "0"
    sign = "-" if f < 0 else ""
    # shortest round-trip digits and decimal exponent, from Python's repr
    mant, _, ex = ("%r" % abs(float(f))).partition("e")
    ip, _, fp = mant.partition(".")
    allds = (ip + fp).lstrip("0")
    lead = len(ip + fp) - len(allds) if ip.strip("0") == "" else 0
    dp = len(ip) + int(ex or 0) - lead if ip.strip("0") else int(ex or 0) - lead + 1
    digits = allds.rstrip("0") or "0"
    exp = dp - 1
    if exp < -4 or exp >= 6:  # shortest formatting: eprec is 6
        m = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return "%s%se%s%02d" % (sign, m, "-" if exp < 0 else "+", abs(exp))
    if dp <= 0:
        return sign + "0." + "0" * (-dp) + digits
    if dp >= len(digits):
        return sign + digits + "0" * (dp - len(digits))
    return sign + digits[:dp] + "." + digits[dp:]


def to_go_values(v):
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        return GoFloat(v)
    if isinstance(v, dict):
        return {str(k): to_go_values(x) for k, x in v.items()}
    if isinstance(v, list):
        return [to_go_values(x) for x in v]
    return v


def plain(v):
    """Convert to plain Python for yaml/json dumping (float64 ints -> int)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, float):
        if v == int(v) and abs(v) < 1e21:
            return int(v)
        return float(v)
    if isinstance(v, int):
        return v
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


def go_str(v):
    if v is None:
        return ""  # helm replaces "<no value>" with ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, GoFloat):
        return str(v)
    if isinstance(v, float):
        return go_format_float(v)
    if isinstance(v, (dict, list)):
        raise TemplateError("refusing to print a %s directly (use toYaml/toJson)" % type(v).__name__)
    return str(v)


def truthy(v):
    if v is None or v is False:
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v != 0
    if isinstance(v, (str, list, dict, tuple)):
        return len(v) > 0
    return True


class Missing:
    """Result of looking up a key that is not there (prints as empty)."""

    def __init__(self, path):
        self.path = path

    def __bool__(self):
        return False


def unmissing(v):
    return None if isinstance(v, Missing) else v


# ---------------------------------------------------------------- functions

def _yaml_dump(v):
    if v is None:
        return "null"
    out = yaml.safe_dump(plain(v), default_flow_style=False, sort_keys=True, width=1 << 30)
    if out.endswith("...\n"):
        out = out[:-4]
    return out.rstrip("\n")


def _indent(n, s):
    pad = " " * int(n)
    return "\n".join(pad + line for line in go_str(s).split("\n"))


def _printf(fmt, *args):
    out, i, ai = [], 0, 0
    while i < len(fmt):
        c = fmt[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        verb = fmt[i + 1]
        i += 2
        if verb == "%":
            out.append("%")
            continue
        a = unmissing(args[ai])
        ai += 1
        if verb in "sv":
            out.append(go_str(a))
        elif verb == "d":
            if isinstance(a, float) and not isinstance(a, GoFloat) and a == int(a):
                a = int(a)
            if isinstance(a, GoFloat):
                out.append("%!d(float64=" + str(a) + ")")
            else:
                out.append(str(int(a)))
        elif verb == "q":
            out.append(json.dumps(go_str(a)))
        else:
            raise TemplateError("printf verb %%%s not supported" % verb)
    return "".join(out)


def _required(msg, v):
    v = unmissing(v)
    if v is None or (isinstance(v, str) and v == ""):
        raise TemplateError("required: " + msg)
    return v


def _fail(msg):
    raise TemplateError("fail: " + msg)


def _default(d, *v):
    val = unmissing(v[0]) if v else None
    return val if truthy(val) else d


def _to_int(v):
    v = unmissing(v)
    if v is None:
        return 0
    if isinstance(v, str):
        try:
            return int(float(v))
        except ValueError:
            return 0
    return int(v)


def _cmp_args(a, b):
    a, b = unmissing(a), unmissing(b)
    return a, b


def _and(*args):
    for a in args:
        if not truthy(unmissing(a)):
            return a
    return args[-1]


def _or(*args):
    for a in args:
        if truthy(unmissing(a)):
            return a
    return args[-1]


def _has_key(d, k):
    d = unmissing(d)
    if not isinstance(d, dict):
        raise TemplateError("hasKey: not a map")
    return k in d


FUNCS = {
    "toYaml": _yaml_dump,
    "toJson": lambda v: json.dumps(plain(unmissing(v)), sort_keys=True, separators=(",", ":")),
    "nindent": lambda n, s: "\n" + _indent(n, s),
    "indent": _indent,
    "quote": lambda *a: " ".join(json.dumps(go_str(unmissing(x))) for x in a),
    "squote": lambda *a: " ".join("'" + go_str(unmissing(x)) + "'" for x in a),
    "default": _default,
    "required": _required,
    "fail": _fail,
    "printf": _printf,
    "print": lambda *a: "".join(go_str(unmissing(x)) for x in a),
    "trunc": lambda n, s: go_str(s)[: int(n)] if int(n) >= 0 else go_str(s)[int(n):],
    "trimSuffix": lambda suf, s: go_str(s)[: -len(suf)] if suf and go_str(s).endswith(suf) else go_str(s),
    "trimPrefix": lambda pre, s: go_str(s)[len(pre):] if pre and go_str(s).startswith(pre) else go_str(s),
    "trim": lambda s: go_str(s).strip(),
    "replace": lambda old, new, s: go_str(s).replace(old, new),
    "contains": lambda sub, s: sub in go_str(s),
    "lower": lambda s: go_str(s).lower(),
    "upper": lambda s: go_str(s).upper(),
    "toString": lambda v: go_str(unmissing(v)),
    "int": _to_int,
    "int64": _to_int,
    "eq": lambda a, *b: any(_cmp_args(a, x)[0] == _cmp_args(a, x)[1] for x in b),
    "ne": lambda a, b: unmissing(a) != unmissing(b),
    "lt": lambda a, b: unmissing(a) < unmissing(b),
    "le": lambda a, b: unmissing(a) <= unmissing(b),
    "gt": lambda a, b: unmissing(a) > unmissing(b),
    "ge": lambda a, b: unmissing(a) >= unmissing(b),
    "and": _and,
    "or": _or,
    "not": lambda v: not truthy(unmissing(v)),
    "empty": lambda v: not truthy(unmissing(v)),
    "hasKey": _has_key,
    "list": lambda *a: list(a),
    "has": lambda needle, hay: needle in (unmissing(hay) or []),
    "b64enc": lambda s: base64.b64encode(go_str(s).encode()).decode(),
    "sha256sum": lambda s: hashlib.sha256(go_str(s).encode()).hexdigest(),
}

# ---------------------------------------------------------------- lexer/parser

ACTION_RE = re.compile(r"\{\{(- )?(.*?)( -)?\}\}", re.S)


class Node:
    pass


class Text(Node):
    def __init__(self, s):
        self.s = s


class Action(Node):
    def __init__(self, pipe, src):
        self.pipe = pipe
        self.src = src


class If(Node):
    def __init__(self, branches, else_body):
        self.branches = branches  # [(pipe, body)]
        self.else_body = else_body


class With(Node):
    def __init__(self, pipe, body, else_body):
        self.pipe, self.body, self.else_body = pipe, body, else_body


class Range(Node):
    def __init__(self, vars_, pipe, body, else_body):
        self.vars, self.pipe, self.body, self.else_body = vars_, pipe, body, else_body


TOKEN_RE = re.compile(
    r"""\s*(?:
      (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<raw>`[^`]*`)
    | (?P<num>-?\d+(?:\.\d+)?)
    | (?P<decl>:=)
    | (?P<assign>=)
    | (?P<pipe>\|)
    | (?P<lp>\()
    | (?P<rp>\))
    | (?P<comma>,)
    | (?P<field>(?:\$[A-Za-z0-9_]*)?(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\$[A-Za-z0-9_]*|\.)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.X,
)


def tokenize(src):
    toks, pos = [], 0
    src = src.strip()
    while pos < len(src):
        m = TOKEN_RE.match(src, pos)
        if not m or m.end() == pos:
            raise TemplateError("cannot tokenize %r at %r" % (src, src[pos:]))
        kind = m.lastgroup
        toks.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(src) and src[pos].isspace():
            pos += 1
    return toks


def parse_pipeline(toks):
    """Returns ('pipe', decl, commands); a command is a list of operands."""
    decl = None
    if len(toks) >= 2 and toks[0][0] == "field" and toks[0][1].startswith("$") and toks[1][0] in ("decl", "assign"):
        decl = (toks[1][0], toks[0][1])
        toks = toks[2:]
    cmds, cur, i = [], [], 0
    while i < len(toks):
        kind, val = toks[i]
        if kind == "pipe":
            cmds.append(cur)
            cur = []
            i += 1
            continue
        if kind == "lp":
            depth, j = 1, i + 1
            while j < len(toks) and depth:
                if toks[j][0] == "lp":
                    depth += 1
                elif toks[j][0] == "rp":
                    depth -= 1
                j += 1
            if depth:
                raise TemplateError("unbalanced parenthesis")
            cur.append(("sub", parse_pipeline(toks[i + 1 : j - 1])))
            i = j
            continue
        if kind in ("rp", "comma", "decl", "assign"):
            raise TemplateError("unexpected %r" % val)
        if kind == "str":
            cur.append(("lit", json.loads(val)))
        elif kind == "raw":
            cur.append(("lit", val[1:-1]))
        elif kind == "num":
            cur.append(("lit", GoFloat(float(val)) if "." in val else int(val)))
        elif kind == "ident":
            if val in ("true", "false"):
                cur.append(("lit", val == "true"))
            elif val == "nil":
                cur.append(("lit", None))
            else:
                cur.append(("ident", val))
        elif kind == "field":
            cur.append(("field", val))
        i += 1
    if cur:
        cmds.append(cur)
    if not cmds:
        raise TemplateError("empty pipeline")
    return ("pipe", decl, cmds)


def lex(text):
    """Split into ('text', s) and ('action', src) with trimming applied."""
    items, pos = [], 0
    for m in ACTION_RE.finditer(text):
        items.append(["text", text[pos : m.start()]])
        if m.group(1):
            items[-1][1] = items[-1][1].rstrip(" \t\r\n")
        items.append(["action", m.group(2), bool(m.group(3))])
        pos = m.end()
    items.append(["text", text[pos:]])
    out, trim_next = [], False
    for it in items:
        if it[0] == "text":
            s = it[1].lstrip(" \t\r\n") if trim_next else it[1]
            trim_next = False
            out.append(("text", s))
        else:
            trim_next = it[2]
            out.append(("action", it[1].strip()))
    return out


def parse(text, defines, name):
    items = lex(text)
    pos = 0

    def parse_list(stop):
        nonlocal pos
        nodes = []
        while pos < len(items):
            kind, val = items[pos]
            if kind == "text":
                if val:
                    nodes.append(Text(val))
                pos += 1
                continue
            if val.startswith("/*"):
                if not val.endswith("*/"):
                    raise TemplateError("%s: bad comment %r" % (name, val))
                pos += 1
                continue
            word = val.split(None, 1)[0] if val else ""
            rest = val[len(word):].strip()
            if word in stop:
                return nodes, word, rest
            pos += 1
            if word == "if":
                branches, cond = [], rest
                while True:
                    body, w, r = parse_list(("else", "end"))
                    branches.append((parse_pipeline(tokenize(cond)), body))
                    pos += 1
                    if w == "end":
                        nodes.append(If(branches, []))
                        break
                    if r.startswith("if "):
                        cond = r[3:]
                        continue
                    if r:
                        raise TemplateError("%s: unsupported else form %r" % (name, r))
                    else_body, w2, _ = parse_list(("end",))
                    pos += 1
                    nodes.append(If(branches, else_body))
                    break
            elif word in ("with", "range"):
                body, w, r = parse_list(("else", "end"))
                pos += 1
                else_body = []
                if w == "else":
                    if r:
                        raise TemplateError("%s: unsupported else form %r" % (name, r))
                    else_body, _, _ = parse_list(("end",))
                    pos += 1
                if word == "with":
                    nodes.append(With(parse_pipeline(tokenize(rest)), body, else_body))
                else:
                    vars_ = []
                    m = re.match(r"^(\$\w+)\s*(?:,\s*(\$\w+)\s*)?:=\s*(.*)$", rest, re.S)
                    if m:
                        vars_ = [v for v in (m.group(1), m.group(2)) if v]
                        rest = m.group(3)
                    nodes.append(Range(vars_, parse_pipeline(tokenize(rest)), body, else_body))
            elif word == "define":
                dname = json.loads(rest)
                body, _, _ = parse_list(("end",))
                pos += 1
                defines[dname] = body
            elif word in ("else", "end"):
                raise TemplateError("%s: unexpected {{%s}}" % (name, word))
            elif word in ("template", "block", "break", "continue"):
                raise TemplateError("%s: {{%s}} is not supported by this renderer" % (name, word))
            else:
                nodes.append(Action(parse_pipeline(tokenize(val)), val))
        if stop:
            raise TemplateError("%s: missing {{end}}" % name)
        return nodes, None, None

    nodes, _, _ = parse_list(())
    return nodes


# ---------------------------------------------------------------- evaluation

class Files:
    def __init__(self, chart_dir):
        self.chart_dir = chart_dir

    def Get(self, path):
        full = os.path.join(self.chart_dir, path)
        if not os.path.isfile(full):
            raise TemplateError(".Files.Get: %s does not exist in the chart" % path)
        with open(full, encoding="utf-8") as fh:
            return fh.read()


class Renderer:
    def __init__(self, defines, strict):
        self.defines = defines
        self.strict = strict
        self.missing = []

    def lookup(self, obj, name, path):
        if isinstance(obj, Missing):
            return Missing(path)
        if isinstance(obj, dict):
            if name in obj:
                return obj[name]
            return Missing(path)
        if obj is None:
            return Missing(path)
        if hasattr(obj, name):
            return getattr(obj, name)
        raise TemplateError("can't evaluate field %s in %r" % (name, obj))

    def eval_field(self, ref, dot, scope):
        if ref == ".":
            return dot
        m = re.match(r"^(\$[A-Za-z0-9_]*)?((?:\.[A-Za-z_][A-Za-z0-9_]*)*)$", ref)
        var, chain = m.group(1), m.group(2)
        if var is not None:
            if var not in scope:
                raise TemplateError("undefined variable %s" % var)
            obj = scope[var]
        else:
            obj = dot
        path = var or ""
        for part in [p for p in chain.split(".") if p]:
            path += "." + part
            obj = self.lookup(obj, part, path)
            if isinstance(obj, Missing) and self.strict and ".Values." in path + "." and obj.path == path:
                self.missing.append(path)
        return obj

    def eval_operand(self, op, dot, scope):
        kind, val = op
        if kind == "lit":
            return val
        if kind == "field":
            return self.eval_field(val, dot, scope)
        if kind == "sub":
            return self.eval_pipe(val, dot, scope)
        if kind == "ident":
            raise TemplateError("function %s used as a value" % val)
        raise TemplateError("bad operand %r" % (op,))

    def eval_command(self, cmd, dot, scope, piped):
        head = cmd[0]
        extra = [] if piped is _NOPIPE else [piped]
        if head[0] == "ident":
            fname = head[1]
            args = [self.eval_operand(a, dot, scope) for a in cmd[1:]] + extra
            if fname == "include":
                if len(args) != 2:
                    raise TemplateError("include needs a name and a context")
                return self.include(args[0], args[1])
            if fname not in FUNCS:
                raise TemplateError("function %r is not supported by this renderer" % fname)
            try:
                return FUNCS[fname](*args)
            except TemplateError:
                raise
            except Exception as exc:  # noqa: BLE001 - report as template error
                raise TemplateError("%s(%r): %s" % (fname, args, exc))
        val = self.eval_operand(head, dot, scope)
        if callable(val):
            args = [self.eval_operand(a, dot, scope) for a in cmd[1:]] + extra
            return val(*args)
        if len(cmd) > 1 or extra:
            raise TemplateError("%r is not a function" % (head,))
        return val

    def eval_pipe(self, pipe, dot, scope):
        _, decl, cmds = pipe
        val = _NOPIPE
        for cmd in cmds:
            val = self.eval_command(cmd, dot, scope, val)
        if decl:
            kind, var = decl
            if kind == "assign" and var not in scope:
                raise TemplateError("assignment to undeclared %s" % var)
            scope[var] = val
            return _NOTHING
        return val

    def include(self, name, data):
        if name not in self.defines:
            raise TemplateError("include of undefined template %r" % name)
        return self.render_nodes(self.defines[name], data, {"$": data})

    def render_nodes(self, nodes, dot, scope):
        out = []
        for n in nodes:
            if isinstance(n, Text):
                out.append(n.s)
            elif isinstance(n, Action):
                v = self.eval_pipe(n.pipe, dot, scope)
                if v is not _NOTHING:
                    out.append(go_str(unmissing(v)))
            elif isinstance(n, If):
                for pipe, body in n.branches:
                    if truthy(unmissing(self.eval_pipe(pipe, dot, scope))):
                        out.append(self.render_nodes(body, dot, dict(scope)))
                        break
                else:
                    out.append(self.render_nodes(n.else_body, dot, dict(scope)))
            elif isinstance(n, With):
                v = unmissing(self.eval_pipe(n.pipe, dot, scope))
                if truthy(v):
                    out.append(self.render_nodes(n.body, v, dict(scope)))
                else:
                    out.append(self.render_nodes(n.else_body, dot, dict(scope)))
            elif isinstance(n, Range):
                v = unmissing(self.eval_pipe(n.pipe, dot, scope))
                if isinstance(v, dict):
                    pairs = [(k, v[k]) for k in sorted(v)]
                elif isinstance(v, (list, tuple)):
                    pairs = list(enumerate(v))
                elif v is None:
                    pairs = []
                else:
                    raise TemplateError("range over %r" % (v,))
                if not pairs:
                    out.append(self.render_nodes(n.else_body, dot, dict(scope)))
                for k, item in pairs:
                    s = dict(scope)
                    if len(n.vars) == 1:
                        s[n.vars[0]] = item
                    elif len(n.vars) == 2:
                        s[n.vars[0]], s[n.vars[1]] = k, item
                    out.append(self.render_nodes(n.body, item, s))
            else:
                raise TemplateError("bad node")
        return "".join(out)


_NOPIPE = object()
_NOTHING = object()

# ---------------------------------------------------------------- values


def deep_merge(base, over):
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            deep_merge(base[k], v)
        else:
            base[k] = v
    return base


def set_path(values, dotted, raw):
    keys = dotted.split(".")
    cur = values
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
    cur[keys[-1]] = yaml.safe_load(raw) if raw != "" else ""


class Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def render_chart(chart_dir, release, namespace, value_files, sets, strict):
    with open(os.path.join(chart_dir, "Chart.yaml"), encoding="utf-8") as fh:
        chart = yaml.safe_load(fh)
    values = {}
    vpath = os.path.join(chart_dir, "values.yaml")
    if os.path.exists(vpath):
        with open(vpath, encoding="utf-8") as fh:
            values = yaml.safe_load(fh) or {}
    for f in value_files:
        with open(f, encoding="utf-8") as fh:
            deep_merge(values, yaml.safe_load(fh) or {})
    for s in sets:
        k, _, v = s.partition("=")
        set_path(values, k, v)

    schema_path = os.path.join(chart_dir, "values.schema.json")
    if os.path.exists(schema_path):
        import jsonschema  # only needed when the chart has a schema

        with open(schema_path, encoding="utf-8") as fh:
            schema = json.load(fh)
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(values), key=str)
        if errors:
            raise TemplateError(
                "values do not match values.schema.json:\n"
                + "\n".join("  %s: %s" % ("/".join(map(str, e.path)), e.message) for e in errors)
            )

    root = {
        "Values": to_go_values(copy.deepcopy(values)),
        "Release": Obj(Name=release, Namespace=namespace, Service="Helm", IsInstall=True,
                       IsUpgrade=False, Revision=1),
        "Chart": Obj(Name=chart["name"], Version=chart["version"],
                     AppVersion=chart.get("appVersion", ""), Description=chart.get("description", "")),
        "Files": Files(chart_dir),
        "Capabilities": Obj(KubeVersion=Obj(Version="v1.31.0", Major="1", Minor="31")),
    }
    tdir = os.path.join(chart_dir, "templates")
    names = sorted(f for f in os.listdir(tdir) if os.path.isfile(os.path.join(tdir, f)))
    defines, parsed = {}, {}
    for f in names:
        with open(os.path.join(tdir, f), encoding="utf-8") as fh:
            text = fh.read()
        nodes = parse(text, defines, f)
        if not f.startswith("_") and f.endswith((".yaml", ".yml")):
            parsed[f] = nodes
        elif not f.startswith("_") and f != "NOTES.txt":
            raise TemplateError("unexpected file templates/%s" % f)
    r = Renderer(defines, strict)
    docs = []
    for f in sorted(parsed):
        root["Template"] = Obj(Name="%s/templates/%s" % (chart["name"], f),
                               BasePath="%s/templates" % chart["name"])
        try:
            out = r.render_nodes(parsed[f], root, {"$": root})
        except TemplateError as exc:
            raise TemplateError("templates/%s: %s" % (f, exc))
        if out.strip():
            docs.append("---\n# Source: %s/templates/%s\n%s\n" % (chart["name"], f, out.strip("\n")))
    if "NOTES.txt" in names:  # render it too, so a broken NOTES fails here
        with open(os.path.join(tdir, "NOTES.txt"), encoding="utf-8") as fh:
            r.render_nodes(parse(fh.read(), defines, "NOTES.txt"), root, {"$": root})
    if strict and r.missing:
        raise TemplateError("strict: template reads values that are not set: " + ", ".join(sorted(set(r.missing))))
    return "".join(docs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chart")
    ap.add_argument("--release", default="gap-healer")
    ap.add_argument("--namespace", default="gap-healer")
    ap.add_argument("-f", "--values", action="append", default=[])
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--strict", action="store_true")
    a = ap.parse_args()
    try:
        out = render_chart(a.chart, a.release, a.namespace, a.values, a.set, a.strict)
    except TemplateError as exc:
        print("helm_render: error: %s" % exc, file=sys.stderr)
        return 1
    # Every document must be YAML, as helm itself would insist.
    try:
        list(yaml.safe_load_all(out))
    except yaml.YAMLError as exc:
        print(out, file=sys.stderr)
        print("helm_render: error: rendered output is not valid YAML: %s" % exc, file=sys.stderr)
        return 1
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
