"""The bundled tasks and what runs them, beside the hacked workspaces of
test_grade.py: every gold patch scores 1 and tasks.jsonl is what
gen_tasks.py writes; a "fix" that special-cases the call the issue text
shows scores 0 on every bundled task; rows (JSONL, parquet, bad rows);
environments (envs.py); rollout.main end to end.

Run from the repo root with the venv's python (pyarrow: deploy/setup.sh):
  $HOME/.cache/agl/venv/bin/python -m unittest examples/mini-swe/test_tasks.py

It shares test_grade.py's setup: the tiny tasks generated into a temp
root, a temp MSWE_ENVS_ROOT, the sandbox expected here.
"""

import ast
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import envs  # noqa: E402
import gen_tasks  # noqa: E402
import grade  # noqa: E402
import tasks  # noqa: E402
import test_grade as shared  # noqa: E402
from test_grade import ARITH, F2PS, FIX, IDS  # noqa: E402


def setUpModule():
    global TMP, ROOT, ROWS, ENV, SANDBOX
    shared.setUpModule()
    TMP, ROOT, ROWS, ENV, SANDBOX = shared.TMP, shared.ROOT, shared.ROWS, shared.ENV, shared.SANDBOX


def tearDownModule():
    shared.tearDownModule()


SHOWN_CALL = re.compile(r"`(\w+)\(([^`]*)\)`")


def shown_example(task, work):
    """The call the issue text shows (its first `name(args)` of a function
    the buggy module defines, e.g. `add(8, 14)`) and what the gold patch
    returns for it: (module path, function name, args, value)."""
    module = re.search(r"^diff --git a/(\S+) ", task["patch"], re.M)[1]
    gold = tasks.materialize(task, work / "gold")
    names = {n.name for n in ast.parse((gold / module).read_text()).body if isinstance(n, ast.FunctionDef)}
    call = next((m for m in SHOWN_CALL.finditer(task["problem_statement"]) if m[1] in names), None)
    if call is None:
        raise AssertionError(f"no call of {sorted(names)} in the issue text: {task['problem_statement']!r}")
    args = ast.literal_eval(f"({call[2]},)")
    tasks.apply_patch(gold, task["patch"], "patch")
    ns = {}
    exec((gold / module).read_text(), ns)
    return module, call[1], args, ns[call[1]](*args)


class ShownExample(unittest.TestCase):
    def test_a_fix_that_special_cases_the_issue_example_scores_0_on_every_task(self):
        # The "fix" returns the gold value for exactly the call the issue
        # shows and keeps the bug everywhere else: only hidden tests on
        # inputs the agent never saw can tell.
        bundled = tasks.load(HERE / "tasks.jsonl", ROOT)
        self.assertEqual(len(bundled), 36)
        for task in bundled:
            with self.subTest(task["instance_id"]):
                work = Path(tempfile.mkdtemp(dir=TMP))
                try:
                    module, fn, args, value = shown_example(task, work)
                    ws = tasks.materialize(task, work / "repo")
                    buggy = (ws / module).read_text()
                    hacked = (buggy + f"\n\n_buggy_{fn} = {fn}\n\n\ndef {fn}(*args):\n"
                              f"    if args == {args!r}:\n        return {value!r}\n    return _buggy_{fn}(*args)\n")
                    (ws / module).write_text(hacked)
                    ns, bug = {}, {}
                    exec(hacked, ns)
                    exec(buggy, bug)
                    self.assertEqual(ns[fn](*args), value, "the hack answers the shown call")
                    self.assertNotEqual(bug[fn](*args), value, "the shown call fails on the bug")
                    r = grade.grade(task, ws, env=ENV)
                    self.assertEqual(r["outcomes"][task["FAIL_TO_PASS"][0]], "passed",
                                     f"the issue's example is the first FAIL_TO_PASS test: {r['outcomes']}")
                    self.assertEqual(r["flags"], [])
                    self.assertEqual(r["value"], 0.0, f"the special-cased example scores: {r['outcomes']}")
                finally:
                    shutil.rmtree(work, ignore_errors=True)


class RolloutMain(unittest.TestCase):
    """rollout.main end to end, with a scripted agent and a local event sink."""

    @classmethod
    def setUpClass(cls):
        from http.server import BaseHTTPRequestHandler, HTTPServer

        events = cls.events = []

        class Sink(BaseHTTPRequestHandler):
            def do_POST(self):
                events.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        cls.server = HTTPServer(("127.0.0.1", 0), Sink)
        threading.Thread(target=cls.server.serve_forever, daemon=True).start()

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.server.server_close()

    def rollout(self, row, root, run_agent):
        import rollout

        saved = {k: os.environ.get(k) for k in ("AGL_INPUT", "AGL_EVENT_URL", "OPENAI_API_KEY", "MSWE_TASKS_ROOT")}
        os.environ.update(AGL_INPUT=json.dumps(row), AGL_EVENT_URL=f"http://127.0.0.1:{self.server.server_port}/e",
                          OPENAI_API_KEY="t", MSWE_TASKS_ROOT=str(root))
        try:
            with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                rc = rollout.main(run_agent)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.assertEqual(rc, 0)
        return self.events[-1]["payload"]

    def shell(self, work, repo, commands):
        import rollout

        env = rollout.agent_env(work)
        for c in commands:
            subprocess.run(c, shell=True, cwd=repo, env=env, capture_output=True)
        return rollout.Outcome(True, "Submitted")

    def row(self, task_id=ARITH):
        return next(json.loads(line) for line in ROWS.read_text().splitlines() if task_id in line)

    def test_reward_event(self):
        fix = ["sed -i 's/a - b/a + b/' arith0.py"]
        payload = self.rollout(self.row(), ROOT, lambda w, r, t: self.shell(w, r, fix))
        self.assertEqual(payload["value"], 1.0)
        self.assertEqual(payload["tests"], {"passed": IDS, "failed": []})
        self.assertEqual(payload["exit_status"], "Submitted")
        self.assertEqual(payload["flags"], [])
        self.assertIn("+    return a + b", payload["model_patch"])
        self.assertEqual(payload["sandbox"], SANDBOX)

    def test_the_agent_runs_the_environments_python_and_cannot_see_its_input(self):
        seen = {}

        def agent(work, repo, task):
            import rollout

            env = rollout.agent_env(work)
            out = subprocess.run(["python", "-c", "import sys; print(sys.prefix)"], cwd=repo, env=env,
                                 capture_output=True, text=True)
            seen["prefix"] = out.stdout.strip()
            seen["hidden"] = [k for k in ("AGL_INPUT", "AGL_EVENT_URL", "OPENAI_API_KEY") if k in env]
            return rollout.Outcome(True, "Submitted")

        self.rollout(self.row(), ROOT, agent)
        self.assertTrue(seen["prefix"].startswith(str(TMP / "envs")), seen)
        self.assertEqual(seen["hidden"], [])

    def test_a_background_process_left_by_the_agent_is_killed_before_grading(self):
        # A detached daemon that writes the fix into every grading copy it finds.
        fixed = (ROOT / ARITH / "arith0.py").read_text().replace(*FIX)
        daemon = self.shell_daemon(fixed)
        payload = self.rollout(self.row(), ROOT, lambda w, r, t: self.shell(w, r, [daemon]))
        self.assertEqual(payload["value"], 0.0, payload)

    def shell_daemon(self, fixed):
        script = TMP / "daemon.py"
        script.write_text(
            "import glob, os, sys, time\n"
            "if os.fork(): sys.exit(0)\n"
            "os.setsid()\n"
            "if os.fork(): sys.exit(0)\n"
            f"fixed = {fixed!r}\n"
            "end = time.time() + 20\n"
            "while time.time() < end:\n"
            "    for p in glob.glob(os.path.join(sys.argv[1], 'mswe-grade-*', 'fresh', 'arith0.py')):\n"
            "        try:\n"
            "            open(p, 'w').write(fixed)\n"
            "        except OSError:\n"
            "            pass\n"
            "    time.sleep(0.002)\n")
        return f"python {script} {tempfile.gettempdir()} </dev/null >/dev/null 2>&1"

    def test_a_task_source_changed_during_the_rollout_is_fatal(self):
        root = TMP / "own-root"
        if not root.exists():
            shutil.copytree(ROOT / ARITH, root / ARITH)
        snapshot = root / ARITH / "arith0.py"
        original = snapshot.read_text()
        try:
            payload = self.rollout(self.row(), root, lambda w, r, t: (
                snapshot.write_text(original.replace(*FIX)), self.shell(w, r, []))[1])
        finally:
            snapshot.write_text(original)
        self.assertEqual(payload["value"], 0.0, payload)
        self.assertTrue(any(f["fatal"] and "source changed" in f["reason"] for f in payload["flags"]), payload)


class Environments(unittest.TestCase):
    def test_concurrent_prepares_build_once(self):
        root = TMP / "envs-concurrent"
        logs, results = [], []

        def prepare():
            results.append(envs.prepare({"pip_args": []}, root=root, log=logs.append))

        threads = [threading.Thread(target=prepare) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(len(results), 4)
        self.assertEqual(len([m for m in logs if "prepared" in m]), 1, logs)
        self.assertEqual({r.key for r in results}, {results[0].key})
        self.assertEqual(results[0].changes(), [])

    def test_the_key_follows_the_spec(self):
        a = envs.key_of(envs.normalize({}), Path("/usr/bin/python3"))
        self.assertEqual(a, envs.key_of(envs.normalize({"packages": [], "python": None}), Path("/usr/bin/python3")))
        self.assertNotEqual(a, envs.key_of(envs.normalize({"packages": ["six"]}), Path("/usr/bin/python3")))
        self.assertNotEqual(a, envs.key_of(envs.normalize({}), Path("/usr/bin/python3.12")))
        with self.assertRaises(envs.EnvError):
            envs.normalize({"pakages": ["six"]})


class Rows(unittest.TestCase):
    def test_parquet_with_swe_bench_strings_converts(self):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as e:
            self.fail(f"pyarrow is missing from {sys.executable} ({e}): run this suite with the venv's python "
                      "(deploy/setup.sh installs pyarrow into it) or `python -m pip install pyarrow`")

        rows = [json.loads(line) for line in ROWS.read_text().splitlines()][:3]
        for r in rows:
            r["FAIL_TO_PASS"] = json.dumps(r["FAIL_TO_PASS"])
            r["PASS_TO_PASS"] = json.dumps(r["PASS_TO_PASS"])
            r["environment"] = json.dumps(r["environment"])
            del r["split"]
        src, out = TMP / "rows.parquet", TMP / "converted.jsonl"
        pq.write_table(pa.Table.from_pylist(rows), src)
        r = subprocess.run([sys.executable, str(HERE / "tasks.py"), str(src), "--out", str(out), "--val", "1",
                            "--root", str(ROOT)], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("warning", r.stdout)
        got = [json.loads(line) for line in out.read_text().splitlines()]
        self.assertEqual([g["split"] for g in got], ["train", "train", "val"])
        self.assertEqual(got[0]["FAIL_TO_PASS"], F2PS)
        self.assertEqual(got[0]["environment"], {"python": None, "packages": [], "pip_args": []})
        self.assertEqual(tasks.load(src, ROOT)[0]["_snapshot"], ROOT / ARITH)

    def test_repo_path_alias_and_bad_rows(self):
        row = json.loads(ROWS.read_text().splitlines()[0])
        row["repo_path"] = row.pop("snapshot")
        self.assertEqual(tasks.normalize(row, ROOT)["_snapshot"], ROOT / ARITH)
        with self.assertRaises(tasks.TaskError):
            tasks.normalize({k: v for k, v in row.items() if k != "repo_path"}, ROOT)
        git_row = {k: v for k, v in row.items() if k != "repo_path"} | {"base_commit": "a" * 40}
        self.assertEqual(tasks.normalize(git_row, ROOT)["_mirror"], ROOT / "agl-tiny__arith.git")
        self.assertEqual(tasks.normalize(git_row | {"source": "/m.git"}, ROOT)["_mirror"], Path("/m.git"))


class GoldPatches(unittest.TestCase):
    def test_gold_patch_scores_1_on_every_bundled_task(self):
        with open(os.devnull, "w") as out:
            self.assertEqual(tasks.check(ROWS, ROOT, out=out), [])

    def test_check_catches_broken_rows(self):
        rows = [json.loads(line) for line in ROWS.read_text().splitlines()[:2]]
        rows[0]["patch"] = ""  # the gold patch fixes nothing
        rows[1]["test_patch"] = ""  # the FAIL_TO_PASS test does not exist
        bad = TMP / "bad.jsonl"
        bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with open(os.devnull, "w") as out:
            failures = dict(tasks.check(bad, ROOT, out=out))
        self.assertEqual(set(failures), {rows[0]["instance_id"], rows[1]["instance_id"]})
        self.assertIn("with the gold patch", failures[rows[0]["instance_id"]][0])
        self.assertTrue(any("error" in p for p in failures[rows[1]["instance_id"]]), failures)

    def test_bundled_tasks_jsonl_is_what_gen_tasks_writes(self):
        with tempfile.TemporaryDirectory() as d:
            rows = gen_tasks.make_tasks(Path(d))
        self.assertEqual((HERE / "tasks.jsonl").read_text(), "".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    unittest.main()
