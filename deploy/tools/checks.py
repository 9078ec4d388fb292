#!/usr/bin/env python3
"""Checks behind .ci/deploy-checks that no off-the-shelf tool covers.

Subcommands (each exits non-zero with a message on failure):
  gen-prometheusrule ALERTS            print the Kustomize PrometheusRule built from ALERTS
  sync                                 the copies of alerts.yml still match it
  scrape SCRAPE FILE...                against a scrape of the real binary (its # TYPE lines
                                       are the list of what gap-healer exports): every metric
                                       name FILE... use is exported (a _bucket/_sum/_count
                                       only of a histogram), and every exported one is used
  take-scrape BIN OUT PORT SCHEMA      run BIN (`gap-healer run`) on PostgreSQL (PG* variables;
                                       a store with holes and a checkpoint in SCHEMA, which is
                                       created and dropped) and write its /metrics to OUT
  dashboard JSON RULES_OUT             structural checks; writes the panel queries as
                                       recording rules to RULES_OUT for `promtool check rules`
  toml [--extract DIR] FILE...         gap-healer configs (TOML files, or YAML holding
                                       ConfigMaps with gap-healer.toml) parse and use known keys
                                       ([[stores]]/[[store_sets]] too); --extract writes each to
                                       DIR for `gap-healer config`, with stand-ins for the
                                       connection_string_file(s) it names
  k8s STREAM OUTDIR                    split rendered manifests: built-in kinds to
                                       OUTDIR/core.yaml (for kubernetes-validate), PrometheusRule
                                       specs to OUTDIR/*.rules.yml (for promtool); checks
                                       ServiceMonitor/PodMonitor selectors and the gap-healer
                                       container wiring (daemons, and Jobs/CronJobs running
                                       heal --once; the connection string from a secretKeyRef or
                                       as files on mounted Secrets)
  compose FILE SCHEMA                  a compose file against the compose-spec JSON schema,
                                       plus its bind mounts and build context exist
  docker-context                       files the build needs (Cargo.toml, Cargo.lock, src/, every
                                       include_str!/include_bytes! target) survive .dockerignore
  kustomize-namespace DIR STREAM       the output of DIR's kustomization (STREAM, built by
                                       `kubectl kustomize`) holds no Namespace named as the
                                       kustomization's `namespace:` (an overlay would rename
                                       a base's Namespace, and its labels, to that name)
  readme-overlay README BASE OUTDIR    write the README's example prod overlay to OUTDIR, its
                                       `resources:` pointed at BASE, for `kubectl kustomize`
  helm-lint CHART [OPTS]               Helm's own `lint --strict` (helm-python-sdk): any
                                       message, even INFO, fails
  helm-render CHART [OPTS]             Helm's own rendering (helm-python-sdk), printed like
                                       `helm template`; OPTS: --release NAME --namespace NS
                                       -f VALUES.yaml --set EXPR (Helm's --set syntax)
                                       --kube-version V (helm-lint only)
  helm-values-used CHART               every .Values path the templates read is in values.yaml
  checkov-report JSON FRAMEWORKS       summarise `checkov -o json`; fail on failed checks,
                                       parsing errors, a skip without a reason, or a
                                       framework (comma list) that scanned nothing
"""

import json
import os
import re
import sys
import tomllib

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# What the binary exports is not listed here: it is read from a scrape of the
# binary itself (cmd_scrape), so a metric added, renamed or dropped in src/
# fails the dashboard/alerts check without anyone editing a list.

# The keys of src/config.rs (KEYS). With a built binary, .ci/deploy-checks also
# runs `gap-healer config` on every shipped config, which is authoritative.
CONFIG_KEYS = {
    "engine", "connection_string", "connection_string_file", "schema", "gap_timeout", "poll_interval",
    "lock_timeout", "connect_timeout", "metrics_addr", "start_from", "lookback", "scan_page_size", "dry_run",
    "log_format", "log_level", "tombstone_stream", "tombstone_type", "leader_election",
    "leader_key", "watermark_table", "give_up_after", "discover_interval", "profile", "table",
    "position_column", "columns", "tombstone_stream_id", "stores", "store_sets",
}

METRIC_RE = re.compile(r"gap_healer_[a-z_]+")


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def load_yaml_docs(path):
    with open(path, encoding="utf-8") as fh:
        return [d for d in yaml.safe_load_all(fh) if d is not None]


# ---------------------------------------------------------------- PrometheusRule


def prometheusrule_from_alerts(alerts_path):
    with open(alerts_path, encoding="utf-8") as fh:
        alerts = yaml.safe_load(fh)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gap-healer",
            "namespace": "gap-healer",
            "labels": {"app.kubernetes.io/name": "gap-healer", "app.kubernetes.io/instance": "gap-healer"},
        },
        "spec": alerts,
    }


class _IndentDumper(yaml.SafeDumper):
    """Indents block sequences under their key (as yamllint's default expects)."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def _str_presenter(dumper, data):
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_IndentDumper.add_representer(str, _str_presenter)


def cmd_gen_prometheusrule(args):
    obj = prometheusrule_from_alerts(args[0])
    sys.stdout.write(
        "# GENERATED from deploy/prometheus/alerts.yml - do not edit by hand. Regenerate with:\n"
        "#   python3 deploy/tools/checks.py gen-prometheusrule deploy/prometheus/alerts.yml \\\n"
        "#     > deploy/kubernetes/base/prometheusrule.yaml\n"
        "# Needs the Prometheus Operator CRDs. Add the label your Prometheus selects\n"
        "# (ruleSelector), e.g. release: kube-prometheus-stack.\n"
    )
    sys.stdout.write(yaml.dump(obj, Dumper=_IndentDumper, sort_keys=False, width=100, allow_unicode=True))


def cmd_sync(_args):
    alerts = os.path.join(ROOT, "deploy/prometheus/alerts.yml")
    helm_copy = os.path.join(ROOT, "deploy/helm/gap-healer/files/alerts.yml")
    base_rule = os.path.join(ROOT, "deploy/kubernetes/base/prometheusrule.yaml")
    with open(alerts, "rb") as a, open(helm_copy, "rb") as b:
        if a.read() != b.read():
            fail("%s differs from %s: cp deploy/prometheus/alerts.yml %s" % (helm_copy, alerts, helm_copy))
    want = prometheusrule_from_alerts(alerts)
    got = load_yaml_docs(base_rule)
    if len(got) != 1 or got[0] != want:
        fail("%s is out of date with alerts.yml; regenerate it (see its header)" % base_rule)
    print("OK: helm files/alerts.yml and kustomize prometheusrule.yaml match deploy/prometheus/alerts.yml")


# ---------------------------------------------------------------- metric names


def referenced_metrics(paths):
    """Map metric token as written -> files using it."""
    found = {}
    for p in paths:
        with open(p, encoding="utf-8") as fh:
            text = fh.read()
        for tok in METRIC_RE.findall(text):
            found.setdefault(tok, set()).add(os.path.relpath(p, ROOT))
    return found


def scrape_families(path):
    """(sample names, {family: type}) of a Prometheus text scrape."""
    samples, families = set(), {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split()
                if len(parts) >= 4 and parts[1] == "TYPE":
                    families[parts[2]] = parts[3]
                continue
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", line)
            if m:
                samples.add(m.group(1))
    return samples, families


# The series a family of each type has, besides its own name.
TYPE_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def cmd_scrape(args):
    """The scrape is the binary's word on what it exports: every family with a
    # TYPE line (metrics-exporter-prometheus writes one for each family it
    holds; a family shows up once its first series is recorded, which is why
    the scrape comes from a process that filled holes and read a checkpoint)."""
    scrape, paths = args[0], args[1:]
    samples, families = scrape_families(scrape)
    exported = {f: k for f, k in families.items() if f.startswith("gap_healer_")}
    if not samples or not exported:
        fail("%s holds no gap_healer_* family with a # TYPE line: is it a scrape of gap-healer's /metrics?" % scrape)
    found = referenced_metrics(paths)
    bad, used = [], set()
    for tok, files in sorted(found.items()):
        where = ", ".join(sorted(files))
        if tok in exported:
            # A histogram's own name is a family name (text may name it); its
            # series are the suffixed ones, checked below where they are used.
            used.add(tok)
            if tok not in samples and exported[tok] not in TYPE_SUFFIXES:
                bad.append("%s (used in %s): exported but no sample of it in the scrape" % (tok, where))
            continue
        base = next((tok[: -len(s)] for s in ("_bucket", "_sum", "_count") if tok.endswith(s)), None)
        if base in exported:
            used.add(base)
            if not tok.endswith(TYPE_SUFFIXES.get(exported[base], ())):
                bad.append("%s (used in %s): %s is a %s, it has no %s series"
                           % (tok, where, base, exported[base], tok[len(base):]))
            elif tok not in samples:
                bad.append("%s (used in %s): no sample of it in the scrape" % (tok, where))
            continue
        bad.append("%s (used in %s): not a metric gap-healer exports (its scrape has no such family)" % (tok, where))
    unused = sorted(set(exported) - used)
    if unused:
        bad.append("exported by gap-healer but shown nowhere (dashboard/alerts): " + ", ".join(unused))
    if bad:
        fail("metric names against the scrape %s:\n  %s" % (scrape, "\n  ".join(bad)))
    print("OK: %d metric families in the scrape of gap-healer (%s), every one used, and every one of the %d names "
          "used is exported" % (len(exported), ", ".join("%s %s" % (k, n) for n, k in sorted(
              (sum(1 for v in exported.values() if v == k), k) for k in set(exported.values()))),
                                  len(found)))


def cmd_take_scrape(args):
    """A scrape of the real binary: `gap-healer run` on a store with holes (filled
    within a second), a checkpoint row and a second, empty, store set, so every
    family the binary has appears (holes, fills, tombstones, checkpoint lag, the
    scan histogram, stores by state). SCHEMA is created and dropped."""
    import subprocess
    import time
    import urllib.request

    binary, out, port, schema = args
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", schema):
        fail("take-scrape: %r is not a plain schema name" % schema)
    conn = "host=%s port=%s user=%s dbname=%s" % (os.environ.get("PGHOST", "127.0.0.1"),
                                                   os.environ.get("PGPORT", "5432"),
                                                   os.environ.get("PGUSER", "postgres"),
                                                   os.environ.get("PGDATABASE", "test"))

    def psql(sql):
        env = dict(os.environ, PGOPTIONS="-c client_min_messages=warning")
        subprocess.run(["psql", "-q", "-X", "-v", "ON_ERROR_STOP=1", "-d", os.environ.get("PGDATABASE", "test")],
                       input=sql, text=True, check=True, stdout=subprocess.DEVNULL, env=env)

    with open(os.path.join(ROOT, "tests/fixtures/eventuous_postgres.sql"), encoding="utf-8") as fh:
        fixture = fh.read().replace("__schema__", schema)
    psql("DROP SCHEMA IF EXISTS %s CASCADE;" % schema)
    psql(fixture)
    proc = None
    try:
        # Positions 2-4 are a hole; the checkpoint stands at 1.
        psql("""
INSERT INTO {s}.streams (stream_name, version) VALUES ('demo', 1);
INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, global_position, json_data, created)
OVERRIDING SYSTEM VALUE VALUES
  (gen_random_uuid(), 'Demo', 1, 0, 1, '{{}}', now()),
  (gen_random_uuid(), 'Demo', 1, 1, 5, '{{}}', now());
SELECT setval(pg_get_serial_sequence('{s}.messages', 'global_position'), 5);
INSERT INTO {s}.checkpoints VALUES ('demo-projection', 1);
""".format(s=schema))
        cfg = os.path.join(os.path.dirname(os.path.abspath(out)), "take-scrape.toml")
        with open(cfg, "w", encoding="utf-8") as fh:
            fh.write('engine = "postgres"\nmetrics_addr = "127.0.0.1:%s"\ngap_timeout = "200ms"\n'
                     'poll_interval = "100ms"\nstart_from = 0\n\n'
                     '[[stores]]\nname = "scrape"\nschema = "%s"\nconnection_string = "%s"\n\n'
                     '[[store_sets]]\nname = "none"\ndatabases = "%s_no_such_database_%%"\n'
                     'connection_string = "%s"\n'
                     % (port, schema, conn, schema, conn.rsplit("dbname=", 1)[0] + "dbname={database}"))
        log = open(out + ".log", "w", encoding="utf-8")
        proc = subprocess.Popen([binary, "run", "--config", cfg], stdout=log, stderr=subprocess.STDOUT,
                                env={"PATH": os.environ.get("PATH", "")})
        url = "http://127.0.0.1:%s" % port
        text, deadline = "", time.time() + 20
        while time.time() < deadline:
            time.sleep(0.3)
            if proc.poll() is not None:
                fail("take-scrape: gap-healer exited %s; its log: %s" % (proc.returncode, open(out + ".log").read()))
            try:
                text = urllib.request.urlopen(url + "/metrics", timeout=2).read().decode()
            except OSError:
                continue
            # Holes filled and the histogram there: every family is out.
            if re.search(r'^gap_healer_tombstones_inserted_total\{store="scrape"\} 3$', text, re.M) and \
                    "gap_healer_scan_duration_seconds_count" in text:
                break
        else:
            fail("take-scrape: no scrape of %s with the 3 holes filled within 20 s; last scrape:\n%s" % (url, text))
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(text)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=15)
        psql("DROP SCHEMA IF EXISTS %s CASCADE;" % schema)
    if proc.returncode != 0:
        fail("take-scrape: gap-healer exited %s on SIGTERM" % proc.returncode)
    print("OK: scraped gap-healer %s (%d gap_healer_* samples) into %s"
          % (binary, sum(1 for line in text.splitlines() if line.startswith("gap_healer_")), out))


# ---------------------------------------------------------------- dashboard


def iter_panels(panels):
    for p in panels:
        yield p
        yield from iter_panels(p.get("panels", []))


AGGREGATION_RE = re.compile(
    r"\b(sum|min|max|avg|group|stddev|stdvar|count|count_values|bottomk|topk|quantile|limitk|limit_ratio)"
    r"\s*(?:(by|without)\s*\(([^)]*)\))?\s*\(")


def legend_problems(legend, expr):
    """Labels the legend names ({{store}}) that the query's result cannot
    carry: an aggregation keeps only its `by` labels (none at all without
    one), so `histogram_quantile(0.99, sum by (le) (...))` shows a blank
    {{store}} and mixes every store into one line. Aggregations written with
    `by` after their argument are refused (this check reads the other form)."""
    problems = []
    wanted = re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", legend or "")
    if re.search(r"\)\s*(by|without)\s*\(", expr):
        problems.append("write `by (...)` before the aggregation's argument (sum by (l) (x)), as the others are")
    for m in AGGREGATION_RE.finditer(expr):
        op, clause, labels = m.group(1), m.group(2), m.group(3)
        if clause == "without":
            continue
        kept = {l.strip() for l in (labels or "").split(",") if l.strip()}
        lost = [l for l in wanted if l not in kept]
        if lost:
            problems.append("the legend shows %s, but `%s%s` keeps %s: blank in the legend, and the series of "
                            "every %s are added into one" % (
                                ", ".join("{{%s}}" % l for l in lost), op,
                                " by (%s)" % labels if clause else "",
                                "only " + ", ".join(sorted(kept)) if kept else "no label at all",
                                "/".join(lost)))
    return problems


def cmd_dashboard(args):
    path, rules_out = args
    with open(path, encoding="utf-8") as fh:
        d = json.load(fh)
    errs = []
    if not isinstance(d.get("schemaVersion"), int) or d["schemaVersion"] < 36:
        errs.append("schemaVersion missing or older than 36")
    for k in ("uid", "title"):
        if not d.get(k):
            errs.append("dashboard has no %s" % k)
    tvars = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    ds = tvars.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        errs.append("needs a template variable 'datasource' of type datasource, query prometheus")
    for name in ("job", "instance"):
        v = tvars.get(name)
        if not v or v.get("type") != "query":
            errs.append("needs a query template variable '%s'" % name)
        elif v.get("datasource", {}).get("uid") != "${datasource}":
            errs.append("variable %s must query ${datasource}" % name)
    ids, exprs = set(), []
    panels = list(iter_panels(d.get("panels", [])))
    if not panels:
        errs.append("no panels")
    for p in panels:
        pid = p.get("id")
        if pid in ids:
            errs.append("duplicate panel id %s" % pid)
        ids.add(pid)
        if "gridPos" not in p:
            errs.append("panel %s has no gridPos" % pid)
        if p.get("type") == "row":
            continue
        if not p.get("title"):
            errs.append("panel %s has no title" % pid)
        if p.get("datasource", {}).get("uid") != "${datasource}":
            errs.append("panel %s (%s) must use datasource ${datasource}" % (pid, p.get("title")))
        targets = p.get("targets", [])
        if not targets and p.get("type") != "text":
            errs.append("panel %s (%s) has no queries" % (pid, p.get("title")))
        for t in targets:
            if not t.get("expr"):
                errs.append("panel %s (%s) target %s has no expr" % (pid, p.get("title"), t.get("refId")))
                continue
            if t.get("datasource", {}).get("uid") != "${datasource}":
                errs.append("panel %s target %s must use ${datasource}" % (pid, t.get("refId")))
            exprs.append((pid, t.get("refId"), p.get("title"), t["expr"]))
    for pid, ref, title, e in exprs:
        t = next(t for p in panels if p.get("id") == pid for t in p.get("targets", []) if t.get("refId") == ref)
        errs.extend("panel %s (%s) query %s: %s" % (pid, title, ref, m)
                    for m in legend_problems(t.get("legendFormat", ""), e))
    if errs:
        fail("dashboard %s:\n  %s" % (path, "\n  ".join(errs)))
    # Substitute Grafana variables so promtool can parse each query.
    subst = [("$__rate_interval", "5m"), ("$__interval", "1m"), ("$__range", "1h"),
             ('"$job"', '".*"'), ('"$instance"', '".*"'), ("${job}", ".*"), ("${instance}", ".*"), ('"$store"', '".*"'), ("${store}", ".*")]
    rules = []
    for pid, ref, title, e in exprs:
        for a, b in subst:
            e = e.replace(a, b)
        if "$" in e:
            fail("panel %s (%s) query %s uses a variable this check does not know: %s" % (pid, title, ref, e))
        rules.append({"record": "dashboard:panel_%s_%s" % (pid, ref), "expr": e})
    with open(rules_out, "w", encoding="utf-8") as fh:
        yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}, fh, sort_keys=False)
    print("OK: dashboard structure (%d panels, %d queries written to %s for promtool)"
          % (len(panels), len(rules), rules_out))


# ---------------------------------------------------------------- TOML configs


def check_toml_text(text, where, require_engine=True):
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        fail("%s: not valid TOML: %s" % (where, exc))
    unknown = sorted(set(cfg) - CONFIG_KEYS)
    if unknown:
        fail("%s: unknown gap-healer config keys: %s" % (where, ", ".join(unknown)))
    # [[stores]] / [[store_sets]]: arrays of tables (an inline or JSON-looking
    # list is what the chart once wrote), each with a name and store keys.
    entries = []
    for lst, own in (("stores", {"name"}), ("store_sets", {"name", "databases"})):
        if lst not in cfg:
            continue
        if not isinstance(cfg[lst], list) or not all(isinstance(e, dict) for e in cfg[lst]):
            fail("%s: %s must be an array of tables ([[%s]])" % (where, lst, lst))
        for i, e in enumerate(cfg[lst]):
            at = "%s: [[%s]] %s" % (where, lst, e.get("name", "#%d" % (i + 1)))
            missing = sorted(own - set(e))
            bad = sorted(set(e) - own - (CONFIG_KEYS - {"stores", "store_sets"}))
            if missing or bad:
                fail("%s: %s" % (at, "; ".join((["missing " + ", ".join(missing)] if missing else [])
                                                + (["unknown keys " + ", ".join(bad)] if bad else []))))
            if "connection_string" in e:
                fail("%s: connection_string must not be in a config file that is shipped (use a file)" % at)
            entries.append(e)
    if require_engine and cfg.get("engine") not in ("mssql", "postgres") and not (
            entries and all(e.get("engine") in ("mssql", "postgres") for e in entries)):
        fail("%s: engine must be mssql or postgres" % where)
    if "connection_string" in cfg:
        fail("%s: connection_string must not be in a config file that is shipped (use the Secret/env)" % where)
    for k in ("gap_timeout", "poll_interval", "lock_timeout", "connect_timeout"):
        if k in cfg and not re.fullmatch(r"(\d+(ns|us|ms|s|m|h|d))+", str(cfg[k])):
            fail("%s: %s=%r is not a humantime duration" % (where, k, cfg[k]))
    for k in ("lookback", "scan_page_size"):
        if k in cfg and not isinstance(cfg[k], int):
            fail("%s: %s must be an integer, got %r" % (where, k, cfg[k]))
    for k in ("dry_run", "leader_election"):
        if k in cfg and not isinstance(cfg[k], bool):
            fail("%s: %s must be a boolean" % (where, k))
    if "start_from" in cfg and not (isinstance(cfg["start_from"], int) or cfg["start_from"] in ("checkpoints", "head")):
        fail("%s: start_from must be checkpoints, head or a number" % where)
    if "log_format" in cfg and cfg["log_format"] not in ("text", "json"):
        fail("%s: log_format must be text or json" % where)
    return cfg


# Stand-ins for the files a config names, so `gap-healer config` (which reads
# them) runs on it here; a store set's names each database as {database}.
PLACEHOLDER_CS = {
    "postgres": "host=db.invalid user=gap_healer password=placeholder dbname=%s",
    "mssql": "Server=tcp:db.invalid,1433;Database=%s;User Id=gap_healer;Password=placeholder",
}


def stage_connection_files(cfg, text, where_dir):
    """Writes a stand-in for every connection_string_file of cfg under
    where_dir (the path kept below it) and returns text pointing at them."""
    top_engine = cfg.get("engine", "postgres")
    for lst in (None, "stores", "store_sets"):
        for e in ([cfg] if lst is None else cfg.get(lst) or []):
            path = e.get("connection_string_file")
            if not path:
                continue
            local = os.path.join(where_dir, path.lstrip("/"))
            os.makedirs(os.path.dirname(local), exist_ok=True)
            db = "{database}" if lst == "store_sets" else "eventstore"
            with open(local, "w", encoding="utf-8") as fh:
                fh.write(PLACEHOLDER_CS[e.get("engine", top_engine)] % db + "\n")
            text = text.replace(json.dumps(path), json.dumps(local))
    return text


def cmd_toml(args):
    """toml [--extract DIR] FILE...: with --extract, also writes every config
    found to DIR/<n>-<engine>.toml (for `gap-healer config`), or, when it
    names connection_string_file(s), to DIR/<n>-<engine>-files.toml pointing
    at stand-in files under DIR/files-<n>/ (`gap-healer config` reads them)."""
    extract = None
    if args and args[0] == "--extract":
        extract, args = args[1], args[2:]
        os.makedirs(extract, exist_ok=True)
    n = 0
    for p in args:
        rel = os.path.relpath(p, ROOT)
        if p.endswith(".toml"):
            texts = [(rel, open(p, encoding="utf-8").read())]
        else:
            texts = [("%s ConfigMap %s" % (rel, d["metadata"]["name"]), d["data"]["gap-healer.toml"])
                     for d in load_yaml_docs(p)
                     if d.get("kind") == "ConfigMap" and "gap-healer.toml" in d.get("data", {})]
        for where, text in texts:
            cfg = check_toml_text(text, where)
            n += 1
            if extract:
                engine = cfg.get("engine") or (cfg.get("stores") or cfg.get("store_sets"))[0]["engine"]
                name = "%02d-%s.toml" % (n, engine)
                if connection_files(cfg):
                    name = "%02d-%s-files.toml" % (n, engine)
                    text = stage_connection_files(cfg, text, os.path.join(os.path.abspath(extract), "files-%02d" % n))
                with open(os.path.join(extract, name), "w", encoding="utf-8") as fh:
                    fh.write("# from %s\n%s" % (where, text))
    if n == 0:
        fail("no gap-healer config found in %s" % ", ".join(args))
    print("OK: %d gap-healer config(s) parse and use only known keys" % n)


# ---------------------------------------------------------------- Kubernetes streams

BUILTIN_GROUPS = ("v1", "apps/v1", "policy/v1", "networking.k8s.io/v1", "batch/v1", "rbac.authorization.k8s.io/v1",
                  "autoscaling/v2")


# Workloads whose pods run to completion (gap-healer heal --once), not the daemon.
ONE_SHOT_KINDS = ("Job", "CronJob")


def pod_templates(docs):
    for d in docs:
        if d.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield d, d["spec"]["template"]
        elif d.get("kind") == "CronJob":
            yield d, d["spec"]["jobTemplate"]["spec"]["template"]


def connection_files(cfg):
    """[(where, path)] of every connection_string_file a config names."""
    files = []
    if cfg.get("connection_string_file"):
        files.append(("connection_string_file", cfg["connection_string_file"]))
    for lst in ("stores", "store_sets"):
        for e in cfg.get(lst) or []:
            if isinstance(e, dict) and e.get("connection_string_file"):
                files.append(("[[%s]] %s" % (lst, e.get("name")), e["connection_string_file"]))
    return files


def is_fleet(cfg):
    return bool(cfg.get("stores") or cfg.get("store_sets"))


def secret_volume_names(vol):
    """The Secrets a volume shows as files (a secret volume, or a projected one)."""
    if "secret" in vol:
        return {vol["secret"].get("secretName")}
    return {s["secret"].get("name") for s in vol.get("projected", {}).get("sources", []) if "secret" in s}


def mount_of(path, mounts):
    """The volume mount a file path is on (a subPath mount is the file itself)."""
    for m in sorted(mounts, key=lambda m: -len(m["mountPath"])):
        mp = m["mountPath"].rstrip("/")
        if (m.get("subPath") and path == mp) or (not m.get("subPath") and path.startswith(mp + "/")):
            return m
    return None


def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_gap_healer_pod(owner, tmpl, docs, errs):
    spec = tmpl["spec"]
    name = "%s/%s" % (owner["kind"], owner["metadata"]["name"])
    gh = [c for c in spec.get("containers", []) if c.get("name") == "gap-healer"]
    if not gh:
        return False
    c = gh[0]
    if spec.get("automountServiceAccountToken") is not False:
        errs.append("%s: automountServiceAccountToken must be false" % name)
    if spec.get("enableServiceLinks") is not False:
        errs.append("%s: enableServiceLinks must be false" % name)
    sc = c.get("securityContext", {})
    want = {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
            "runAsUser": 65532}
    for k, v in want.items():
        if sc.get(k) != v:
            errs.append("%s: container gap-healer securityContext.%s must be %r" % (name, k, v))
    if sc.get("capabilities", {}).get("drop") != ["ALL"]:
        errs.append("%s: container gap-healer must drop ALL capabilities" % name)
    if (sc.get("seccompProfile") or spec.get("securityContext", {}).get("seccompProfile", {})).get("type") \
            != "RuntimeDefault":
        errs.append("%s: seccompProfile RuntimeDefault missing" % name)
    one_shot = owner["kind"] in ONE_SHOT_KINDS
    cports = c.get("ports", [])
    if one_shot:
        # heal --once serves no metrics and ends: no port, no probes.
        if spec.get("restartPolicy") not in ("Never", "OnFailure"):
            errs.append("%s: restartPolicy must be Never or OnFailure" % name)
        mport = {}
    elif len(cports) != 1 or not cports[0].get("name"):
        errs.append("%s: container gap-healer must declare exactly one named port (metrics)" % name)
        mport = {}
    else:
        mport = cports[0]
    # A sidecar (gap-healer beside other containers) must not have a readiness
    # probe: the pod is ready only when every container is, so /readyz would
    # take the application out of its Services over the healer's problem.
    sidecar = len(spec.get("containers", [])) > 1
    probes = [] if one_shot else [("livenessProbe", "/healthz")] + ([] if sidecar else [("readinessProbe", "/readyz")])
    if sidecar and "readinessProbe" in c:
        errs.append("%s: the gap-healer sidecar must not have a readinessProbe (it would gate the application's readiness)" % name)
    for probe, path in probes:
        hg = c.get(probe, {}).get("httpGet", {})
        if hg.get("path") != path or hg.get("port") not in (mport.get("name"), mport.get("containerPort")):
            errs.append("%s: %s must GET %s on the metrics port" % (name, probe, path))
    args = c.get("args", [])
    if one_shot and args[:2] != ["heal", "--once"]:
        errs.append("%s: container gap-healer of a %s must run `heal --once`" % (name, owner["kind"]))
    elif not one_shot and (not args or args[0] != "run"):
        errs.append("%s: container gap-healer must run the `run` subcommand" % name)
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    cfg = None
    if "--config" in args:
        cfg_path = args[args.index("--config") + 1]
        mounts = [m for m in c.get("volumeMounts", []) if cfg_path.startswith(m["mountPath"].rstrip("/") + "/")]
        if not mounts:
            errs.append("%s: --config %s is on no volume mount" % (name, cfg_path))
        else:
            vol = vols.get(mounts[0]["name"], {})
            cm_name = vol.get("configMap", {}).get("name")
            key = os.path.basename(cfg_path)
            cms = [d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == cm_name]
            if not cm_name:
                errs.append("%s: the config volume is not a ConfigMap" % name)
            elif not cms:
                errs.append("%s: ConfigMap %s (config volume) is not in the same manifests" % (name, cm_name))
            elif key not in cms[0].get("data", {}):
                errs.append("%s: ConfigMap %s has no key %s" % (name, cm_name, key))
            else:
                cfg = check_toml_text(cms[0]["data"][key], "ConfigMap %s" % cm_name)
                addr = cfg.get("metrics_addr", "0.0.0.0:9477")
                if not one_shot and int(addr.rsplit(":", 1)[1]) != mport.get("containerPort"):
                    errs.append("%s: metrics_addr %s does not match containerPort %s" % (name, addr,
                                                                                      mport.get("containerPort")))
    # The connection string: GAP_HEALER_CONNECTION_STRING from a secretKeyRef,
    # or files on mounted Secrets (connection_string_file in the config, or
    # GAP_HEALER_CONNECTION_STRING_FILE). A config with [[stores]] or
    # [[store_sets]] must use files: gap-healer refuses the variables there
    # (each store names its own database); with a file in the config the
    # variable would outrank it.
    env = {e["name"]: e for e in c.get("env", [])}
    cs = env.get("GAP_HEALER_CONNECTION_STRING", {})
    files = connection_files(cfg or {})
    env_file = env.get("GAP_HEALER_CONNECTION_STRING_FILE")
    own_secrets = set()
    if "value" in cs:
        errs.append("%s: GAP_HEALER_CONNECTION_STRING must not be a literal value" % name)
    if files or is_fleet(cfg or {}) or env_file:
        if cs:
            errs.append("%s: GAP_HEALER_CONNECTION_STRING is set, but the config names connection_string_file or "
                        "lists [[stores]]/[[store_sets]] (gap-healer refuses the variable in a fleet; beside a "
                        "file it would win)" % name)
        if env_file:
            if is_fleet(cfg or {}):
                errs.append("%s: GAP_HEALER_CONNECTION_STRING_FILE is set, but the config lists [[stores]]/"
                            "[[store_sets]]: gap-healer refuses it there" % name)
            files.append(("GAP_HEALER_CONNECTION_STRING_FILE", env_file.get("value", "")))
        for lst in ("stores", "store_sets"):
            for e in (cfg or {}).get(lst) or []:
                if not e.get("connection_string_file") and not (cfg or {}).get("connection_string_file"):
                    errs.append("%s: [[%s]] %s has no connection_string_file (nor has the config one for every "
                                "store)" % (name, lst, e.get("name")))
        for where, path in files:
            m = mount_of(path, c.get("volumeMounts", []))
            secrets = secret_volume_names(vols.get(m["name"], {})) if m else set()
            if not m:
                errs.append("%s: %s %s is on no volume mount of the gap-healer container" % (name, where, path))
            elif not secrets:
                errs.append("%s: %s %s is on volume %s, which is not a Secret" % (name, where, path, m["name"]))
            own_secrets |= secrets
    else:
        if "secretKeyRef" not in cs.get("valueFrom", {}):
            errs.append("%s: GAP_HEALER_CONNECTION_STRING must come from a secretKeyRef" % name)
        own_secrets.add(cs.get("valueFrom", {}).get("secretKeyRef", {}).get("name"))
    # The healer logs in as a login of its own with only the grants of
    # `gap-healer sql` (SECURITY.md), never with the application's: a
    # sidecar must not read a Secret another container of the pod reads.
    own_secrets.discard(None)
    containers = spec.get("containers", []) + spec.get("initContainers", [])
    others = {(e.get("valueFrom", {}).get("secretKeyRef") or {}).get("name")
              for o in containers if o is not c for e in o.get("env", [])}
    others |= {(f.get("secretRef") or {}).get("name")
               for o in containers if o is not c for f in o.get("envFrom", [])}
    others |= {s for o in containers if o is not c for m in o.get("volumeMounts", [])
               for s in secret_volume_names(vols.get(m["name"], {}))}
    for shared in sorted(own_secrets & (others - {None})):
        errs.append("%s: the gap-healer container reads Secret %s, which another container of the pod reads too: "
                    "give the healer a login and a Secret of its own (SECURITY.md)" % (name, shared))
    return True


def cmd_k8s(args):
    stream, outdir = args
    docs = load_yaml_docs(stream)
    os.makedirs(outdir, exist_ok=True)
    core, errs, notes = [], [], []
    rule_files = 0
    services = [d for d in docs if d.get("kind") == "Service"]
    healer_pods = [(o, t) for o, t in pod_templates(docs) if check_gap_healer_pod(o, t, docs, errs)]
    if not healer_pods:
        errs.append("no workload with a gap-healer container in %s" % stream)
    for d in docs:
        kind, api = d.get("kind"), d.get("apiVersion")
        name = "%s/%s" % (kind, d.get("metadata", {}).get("name"))
        if api in BUILTIN_GROUPS:
            core.append(d)
        elif api == "monitoring.coreos.com/v1" and kind == "PrometheusRule":
            rule_files += 1
            path = os.path.join(outdir, "prometheusrule-%d.rules.yml" % rule_files)
            with open(path, "w", encoding="utf-8") as fh:
                yaml.safe_dump(d["spec"], fh, sort_keys=False)
            notes.append("%s: spec written to %s for promtool check rules" % (name, path))
        elif api == "monitoring.coreos.com/v1" and kind == "ServiceMonitor":
            sel = d["spec"].get("selector", {}).get("matchLabels", {})
            ns = d["metadata"].get("namespace")
            match = [s for s in services if labels_match(sel, s["metadata"].get("labels", {}))
                     and s["metadata"].get("namespace") == ns]
            if not match:
                errs.append("%s: selector %s matches no Service (by labels, in namespace %s)" % (name, sel, ns))
            for ep in d["spec"].get("endpoints", []):
                for s in match:
                    if ep.get("port") not in [p.get("name") for p in s["spec"].get("ports", [])]:
                        errs.append("%s: endpoint port %s is not a port name of Service %s"
                                    % (name, ep.get("port"), s["metadata"]["name"]))
            notes.append("%s: CRD, not in kubernetes-validate's schemas; checked that it selects %s"
                         % (name, ", ".join("Service/" + s["metadata"]["name"] for s in match)))
        elif api == "monitoring.coreos.com/v1" and kind == "PodMonitor":
            sel = d["spec"].get("selector", {}).get("matchLabels", {})
            match = [(o, t) for o, t in pod_templates(docs) if labels_match(sel, t["metadata"].get("labels", {}))]
            if not match:
                errs.append("%s: selector %s matches no pod template" % (name, sel))
            for ep in d["spec"].get("podMetricsEndpoints", []):
                for o, t in match:
                    names = [p.get("name") for c in t["spec"]["containers"] for p in c.get("ports", [])]
                    if ep.get("port") not in names:
                        errs.append("%s: port %s is no container port name in %s" % (name, ep.get("port"),
                                                                                   o["metadata"]["name"]))
            notes.append("%s: CRD, not in kubernetes-validate's schemas; checked that it selects %s"
                         % (name, ", ".join(o["kind"] + "/" + o["metadata"]["name"] for o, _ in match)))
        else:
            errs.append("%s: apiVersion %s is neither built-in nor a CRD this check knows" % (name, api))
    def selected(sel, one_shot):
        return [o for o, t in pod_templates(docs)
                if (o["kind"] in ONE_SHOT_KINDS) == one_shot and labels_match(sel, t["metadata"].get("labels", {}))]

    for s in services:
        sel = s["spec"].get("selector", {})
        if not selected(sel, False):
            errs.append("Service/%s: selector %s matches no pod template" % (s["metadata"]["name"], sel))
    netpols = []
    for d in docs:
        if d.get("kind") in ("PodDisruptionBudget", "NetworkPolicy"):
            sel = (d["spec"].get("selector") or d["spec"].get("podSelector") or {}).get("matchLabels", {})
            if not selected(sel, False) and not selected(sel, True):
                errs.append("%s/%s: selector %s matches no pod template" % (d["kind"], d["metadata"]["name"], sel))
            if d["kind"] == "NetworkPolicy":
                netpols.append(sel)
    # A pod that runs to completion is no endpoint and no available replica
    # (a drain could take every daemon pod while it counts); it is, though,
    # under the same egress rules as the daemon.
    for d in services + [d for d in docs if d.get("kind") == "PodDisruptionBudget"]:
        sel = d["spec"].get("selector", {})
        sel = sel.get("matchLabels", sel) if d["kind"] == "PodDisruptionBudget" else sel
        for o in selected(sel, True):
            errs.append("%s/%s: selector %s matches the pods of %s/%s too (they run to completion)"
                        % (d["kind"], d["metadata"]["name"], sel, o["kind"], o["metadata"]["name"]))
    if netpols:
        for o, t in healer_pods:
            if not any(labels_match(sel, t["metadata"].get("labels", {})) for sel in netpols):
                errs.append("%s/%s: no NetworkPolicy of these manifests selects its pods (their egress is open)"
                            % (o["kind"], o["metadata"]["name"]))
    if errs:
        fail("%s:\n  %s" % (stream, "\n  ".join(errs)))
    with open(os.path.join(outdir, "core.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump_all(core, fh, sort_keys=False)
    for n in notes:
        print("  " + n)
    print("OK: %s: %d built-in objects to validate, %d PrometheusRule(s), gap-healer wiring checked (%s)"
          % (stream, len(core), rule_files, ", ".join("%s/%s" % (o["kind"], o["metadata"]["name"])
                                                     for o, _ in healer_pods)))


# ---------------------------------------------------------------- compose


def cmd_compose(args):
    path, schema_path = args
    import jsonschema

    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    with open(schema_path, encoding="utf-8") as fh:
        schema = json.load(fh)
    # The compose-spec schema declares a non-canonical $schema URL; its keywords are draft-07.
    validator = jsonschema.Draft7Validator(schema)
    errs = ["%s: %s" % ("/".join(map(str, e.path)), e.message) for e in validator.iter_errors(doc)]
    base = os.path.dirname(os.path.abspath(path))
    for name, svc in (doc.get("services") or {}).items():
        for v in svc.get("volumes", []):
            src = v.split(":")[0] if isinstance(v, str) else v.get("source", "")
            if src.startswith((".", "/")):
                full = os.path.normpath(os.path.join(base, src))
                if not os.path.exists(full):
                    errs.append("service %s: bind mount source %s does not exist" % (name, src))
        b = svc.get("build")
        if b:
            ctx = os.path.normpath(os.path.join(base, b if isinstance(b, str) else b.get("context", ".")))
            df = os.path.join(ctx, "Dockerfile" if isinstance(b, str) else b.get("dockerfile", "Dockerfile"))
            if not os.path.isfile(df):
                errs.append("service %s: Dockerfile %s does not exist" % (name, df))
        for dep in (svc.get("depends_on") or {}):
            if dep not in doc["services"]:
                errs.append("service %s depends on unknown service %s" % (name, dep))
        if "image" in svc and re.search(r":latest$", svc["image"]) and "mssql" not in svc["image"]:
            errs.append("service %s: image %s is not pinned" % (name, svc["image"]))
    if errs:
        fail("%s:\n  %s" % (path, "\n  ".join(errs)))
    print("OK: %s matches the compose specification schema; mounts and build context exist" % path)


def dockerignore_rules():
    """(negated, pattern, any_depth) per line of .dockerignore."""
    rules = []
    with open(os.path.join(ROOT, ".dockerignore"), encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            neg = line.startswith("!")
            pat = (line[1:] if neg else line).strip("/")
            any_depth = pat.startswith("**/")
            rules.append((neg, pat[3:] if any_depth else pat, any_depth))
    return rules


def docker_excluded(rel, rules):
    """Docker's rule: the last pattern that matches the path or one of its
    parent directories decides; `**/x` matches x at any depth."""
    import fnmatch

    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    windows = ["/".join(parts[i : j + 1]) for i in range(len(parts)) for j in range(i, len(parts))]
    excluded = False
    for neg, pat, any_depth in rules:
        if any(fnmatch.fnmatchcase(c, pat) for c in (windows if any_depth else prefixes)):
            excluded = not neg
    return excluded


def cmd_docker_context(_args):
    rules = dockerignore_rules()
    needed = ["Cargo.toml", "Cargo.lock"]
    inc = re.compile(r"include_(?:str|bytes)!\s*\(\s*\"([^\"]+)\"|include!\s*\(\s*\"([^\"]+)\"")
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, "src")):
        for f in files:
            full = os.path.join(dirpath, f)
            needed.append(os.path.relpath(full, ROOT))
            if f.endswith(".rs"):
                with open(full, encoding="utf-8") as fh:
                    for m in inc.finditer(fh.read()):
                        target = os.path.normpath(os.path.join(dirpath, m.group(1) or m.group(2)))
                        rel = os.path.relpath(target, ROOT)
                        if rel.startswith(".."):
                            fail("%s includes %s, outside the build context" % (os.path.relpath(full, ROOT), rel))
                        needed.append(rel)
    bad = sorted({n for n in needed if docker_excluded(n, rules)})
    missing = sorted({n for n in needed if not os.path.exists(os.path.join(ROOT, n))})
    if bad or missing:
        fail("docker build context: excluded by .dockerignore: %s; missing: %s" % (bad or "-", missing or "-"))
    extra = sorted({n for n in needed if not n.startswith("src/")} - {"Cargo.toml", "Cargo.lock"})
    print("OK: .dockerignore keeps Cargo.toml, Cargo.lock, src/ and the %d file(s) src/ includes at compile time%s"
          % (len(extra), (": " + ", ".join(extra)) if extra else ""))
    for probe in ("target/release/x", ".git/HEAD", "deploy/README.md"):
        if not docker_excluded(probe, rules):
            fail(".dockerignore should exclude %s" % probe.split("/")[0])


def cmd_kustomize_namespace(args):
    kdir, stream = args
    with open(os.path.join(kdir, "kustomization.yaml"), encoding="utf-8") as fh:
        ns = (yaml.safe_load(fh) or {}).get("namespace")
    docs = load_yaml_docs(stream)
    namespaces = [d for d in docs if d.get("kind") == "Namespace"]
    if ns and any(d["metadata"].get("name") == ns for d in namespaces):
        (obj,) = [d for d in namespaces if d["metadata"].get("name") == ns]
        fail("%s sets namespace: %s and its output holds a Namespace of that name (labels %s): kustomize renames "
             "every Namespace of its resources to the overlay's namespace, so applying it would relabel (e.g. "
             "pod-security) a namespace that other applications may share. Keep Namespace objects out of "
             "kustomizations that set namespace:" % (kdir, ns, obj["metadata"].get("labels", {})))
    psa = [d["metadata"]["name"] for d in namespaces
           if any(k.startswith("pod-security.kubernetes.io/") for k in d["metadata"].get("labels", {}))]
    if psa and any(d.get("kind") != "Namespace" for d in docs):
        fail("%s: a Namespace with pod-security labels (%s) is built together with other objects; keep it in a "
             "kustomization of its own" % (kdir, ", ".join(psa)))
    print("OK: %s: namespace %s; Namespace objects in its output: %s"
          % (kdir, ns or "(not set)", ", ".join(d["metadata"]["name"] for d in namespaces) or "none"))


def cmd_readme_overlay(args):
    """The YAML block of deploy/README.md that starts with
    `# overlays/prod/kustomization.yaml`, its `../../base` resource pointed at BASE."""
    readme, base, outdir = args
    with open(readme, encoding="utf-8") as fh:
        text = fh.read()
    m = re.search(r"```yaml\n(# overlays/prod/kustomization\.yaml\n.*?)```", text, re.S)
    if not m:
        fail("%s has no ```yaml block starting with '# overlays/prod/kustomization.yaml'" % readme)
    k = yaml.safe_load(m.group(1))
    if "../../base" not in k.get("resources", []):
        fail("the README's prod overlay no longer lists ../../base: update this check")
    # kustomize takes a base only by a relative path
    rel = os.path.relpath(os.path.abspath(base), os.path.abspath(outdir))
    k["resources"] = [rel if r == "../../base" else r for r in k["resources"]]
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "kustomization.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(k, fh, sort_keys=False)
    print("OK: the README's prod overlay (namespace %s) written to %s" % (k.get("namespace"), outdir))


def helm_args(args):
    """CHART [--release NAME] [--namespace NS] [-f FILE]... [--set EXPR]... [--kube-version V]
    -> (chart, options, values): values as helm's CLI builds them (files, then --set)."""
    import helm_python as helm

    chart, rest = args[0], args[1:]
    opts = {"release": "gap-healer", "namespace": "gap-healer", "kube_version": None}
    values = {}

    def merge(base, over):
        for k, v in over.items():
            if isinstance(v, dict) and isinstance(base.get(k), dict):
                merge(base[k], v)
            else:
                base[k] = v

    i = 0
    while i < len(rest):
        flag, val = rest[i], rest[i + 1]
        if flag == "--release":
            opts["release"] = val
        elif flag == "--namespace":
            opts["namespace"] = val
        elif flag == "--kube-version":
            opts["kube_version"] = val
        elif flag == "-f":
            with open(val, encoding="utf-8") as fh:
                merge(values, helm.values_from_yaml(fh.read()))
        elif flag == "--set":
            merge(values, helm.parse_set_string(val))
        else:
            fail("helm: unknown option %s" % flag)
        i += 2
    return chart, opts, values


def cmd_helm_lint(args):
    import helm_python as helm

    chart, opts, values = helm_args(args)
    r = helm.lint(chart, values or None, strict=True, namespace=opts["namespace"],
                  kube_version=opts["kube_version"])
    sev = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}
    msgs = ["[%s] %s: %s" % (sev.get(m["severity"], m["severity"]), m["path"], m["error"]) for m in r["messages"]]
    what = "helm lint --strict%s%s (Helm %s)" % (" --kube-version " + opts["kube_version"] if opts["kube_version"] else "",
                                                 " with values set (%s)" % ", ".join(sorted(values)) if values else "",
                                                 helm.helm_sdk_version())
    if r.get("total_charts_linted") != 1 or msgs or r.get("errors"):
        fail("%s %s: %d chart(s) linted\n  %s" % (what, chart, r.get("total_charts_linted", 0),
                                                 "\n  ".join(msgs + r.get("errors", []))))
    print("OK: %s %s: 1 chart linted, no message" % (what, chart))


def cmd_helm_render(args):
    import helm_python as helm

    chart_dir, opts, values = helm_args(args)
    try:
        with helm.Chart.load(chart_dir) as chart:
            out = chart.render(values, name=opts["release"], namespace=opts["namespace"])
    except helm.HelmError as exc:
        print("helm: %s" % exc, file=sys.stderr)
        sys.exit(1)
    docs = []
    for path in sorted(out):
        if path.endswith("NOTES.txt") or not out[path].strip():
            continue
        docs.append("---\n# Source: %s\n%s\n" % (path, out[path].strip("\n")))
    stream = "".join(docs)
    try:  # helm install/template would refuse output that is not YAML
        list(yaml.safe_load_all(stream))
    except yaml.YAMLError as exc:
        print(stream, file=sys.stderr)
        fail("helm: rendered output is not valid YAML: %s" % exc)
    sys.stdout.write(stream)


def cmd_helm_values_used(args):
    """Helm renders a .Values key that is not set as empty, silently: every path
    the templates read must be in values.yaml (with its default there)."""
    chart = args[0]
    with open(os.path.join(chart, "values.yaml"), encoding="utf-8") as fh:
        values = yaml.safe_load(fh) or {}
    tdir = os.path.join(chart, "templates")
    used, missing = {}, []
    ref = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
    for f in sorted(os.listdir(tdir)):
        with open(os.path.join(tdir, f), encoding="utf-8") as fh:
            for m in ref.finditer(fh.read()):
                used.setdefault(m.group(1)[1:], set()).add(f)
    for path, files in sorted(used.items()):
        cur = values
        for key in path.split("."):
            if not isinstance(cur, dict) or key not in cur:
                missing.append("%s (in %s)" % (path, ", ".join(sorted(files))))
                break
            cur = cur[key]
    if not used:
        fail("no .Values reference found in %s" % tdir)
    if missing:
        fail("templates read .Values paths that values.yaml does not set (helm would render them empty):\n  "
             + "\n  ".join(missing))
    print("OK: all %d .Values paths the templates read are set in values.yaml" % len(used))


def cmd_checkov_report(args):
    path, frameworks = args[0], [f for f in args[1].split(",") if f]
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        fail("checkov produced no JSON report (%s): %s" % (path, text[:500]))
    reports = data if isinstance(data, list) else [data]
    errs = []
    seen = {r.get("check_type"): r for r in reports}
    for fw in frameworks:
        r = seen.get(fw)
        if not r or not r.get("summary", {}).get("resource_count"):
            errs.append("framework %s scanned no resource" % fw)
    for r in reports:
        sm, res = r.get("summary", {}), r.get("results", {})
        print("  %-11s passed %3d, failed %d, skipped %d, parsing errors %d, resources %d"
              % (r.get("check_type"), sm.get("passed", 0), sm.get("failed", 0), sm.get("skipped", 0),
                 sm.get("parsing_errors", 0), sm.get("resource_count", 0)))
        for c in res.get("skipped_checks", []):
            reason = (c.get("check_result") or {}).get("suppress_comment") or ""
            print("    skipped %s on %s: %s" % (c["check_id"], c.get("resource"), reason))
            if len(reason.strip()) < 10:
                errs.append("%s skipped on %s without a reason" % (c["check_id"], c.get("resource")))
        for c in res.get("failed_checks", []):
            errs.append("%s %s FAILED on %s (%s:%s)" % (c["check_id"], c.get("check_name"), c.get("resource"),
                                                       c.get("file_path"), c.get("file_line_range")))
        if sm.get("parsing_errors"):
            errs.append("%s: parsing errors in %s" % (r.get("check_type"), res.get("parsing_errors")))
    if errs:
        fail("checkov:\n  " + "\n  ".join(errs))
    print("OK: checkov (%s)" % ", ".join(sorted(k for k in seen if k)))


COMMANDS = {
    "docker-context": cmd_docker_context,
    "kustomize-namespace": cmd_kustomize_namespace,
    "readme-overlay": cmd_readme_overlay,
    "helm-lint": cmd_helm_lint,
    "helm-render": cmd_helm_render,
    "helm-values-used": cmd_helm_values_used,
    "checkov-report": cmd_checkov_report,
    "gen-prometheusrule": cmd_gen_prometheusrule,
    "sync": cmd_sync,
    "scrape": cmd_scrape,
    "take-scrape": cmd_take_scrape,
    "dashboard": cmd_dashboard,
    "toml": cmd_toml,
    "k8s": cmd_k8s,
    "compose": cmd_compose,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    COMMANDS[sys.argv[1]](sys.argv[2:])
