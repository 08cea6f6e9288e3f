"""Hacked workspaces against the grader (grade.py): every hack scores 0
with the flag that names it; honest fixes score 1. test_tasks.py (the
bundled tasks, rows, environments, rollout.main) shares its setup.

Run from the repo root (tens of seconds):
  $HOME/.cache/agl/venv/bin/python -m unittest examples/mini-swe/test_grade.py examples/mini-swe/test_tasks.py

Each test generates the bundled tiny tasks into a temp root, builds the
agent's workspace the way rollout.py does (tasks.materialize), applies a
hack, grades, and checks the verdict. Environments are prepared under a
temp MSWE_ENVS_ROOT; the pytest task's (pytest==8.3.4, from PyPI) in the
user's cache: without it those tests fail, they are not skipped. The
grader must use the sandbox this machine supports (expected_sandbox;
MSWE_GRADE_SANDBOX forces one), printed as `grader sandbox: ...`.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import changes  # noqa: E402
import envs  # noqa: E402
import gen_tasks  # noqa: E402
import grade  # noqa: E402
import tasks  # noqa: E402

ARITH = "tiny__arith-0"
F2P = "tests.test_arith0.TestIssue.test_adds"  # the example
F2PS = [F2P] + [f"{F2P}_{k}" for k in range(1, gen_tasks.HIDDEN + 1)]  # and the unseen inputs
P2P = "tests.test_arith0.TestIssue.test_zero"
IDS = F2PS + [P2P]
FIX = ("return a - b", "return a + b")
_saved_env = {}


def expected_sandbox():
    """The sandbox the grader must pick here: the one $MSWE_GRADE_SANDBOX
    forces, else "unshare" where `unshare -rn true` works (probed here,
    apart from grade.py), else "audit"."""
    want = os.environ.get("MSWE_GRADE_SANDBOX", "auto")
    if want != "auto":
        return want
    try:
        r = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "audit"
    return "unshare" if r.returncode == 0 else "audit"


def setUpModule():
    global TMP, ROOT, ROWS, TASKS, ENV, SANDBOX
    SANDBOX = expected_sandbox()
    # On a line of its own, for whoever runs this suite (the e2e wrapper
    # checks it): which sandbox the grading below is expected to use.
    print(f"grader sandbox: {SANDBOX} (MSWE_GRADE_SANDBOX={os.environ.get('MSWE_GRADE_SANDBOX', 'auto')})",
          file=sys.stderr)
    TMP = Path(tempfile.mkdtemp(prefix="mswe-test-grade-"))
    for k, v in {"MSWE_ENVS_ROOT": str(TMP / "envs"), "MSWE_TEST_TIMEOUT": "30"}.items():
        _saved_env[k] = os.environ.get(k)
        os.environ[k] = v
    ROOT = TMP / "repos"
    ROOT.mkdir()
    ROWS = TMP / "tasks.jsonl"
    ROWS.write_text("".join(json.dumps(r) + "\n" for r in gen_tasks.make_tasks(ROOT)))
    TASKS = {t["instance_id"]: t for t in tasks.load(ROWS, ROOT)}
    ENV = envs.prepare({})


def tearDownModule():
    for k, v in _saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    shutil.rmtree(TMP, ignore_errors=True)


def git(*args, cwd=None):
    env = tasks.git_env() | {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                             "GIT_COMMITTER_EMAIL": "t@t"}
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)
    return r


class GradeCase(unittest.TestCase):
    task_id = ARITH

    def setUp(self):
        self.task = TASKS[self.task_id]
        self.dir = Path(tempfile.mkdtemp(dir=TMP))
        self.ws = tasks.materialize(self.task, self.dir / "repo")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def write(self, rel, text):
        path = self.ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def edit(self, rel, old, new):
        path = self.ws / rel
        text = path.read_text()
        self.assertIn(old, text)
        path.write_text(text.replace(old, new))

    def fix(self):
        self.edit("arith0.py", *FIX)

    def grade(self, **kw):
        return grade.grade(self.task, self.ws, env=kw.pop("env", ENV), **kw)

    def assertNaivePasses(self):
        """The hack works against a grader that trusts the workspace: every
        test id, run with `python -m unittest ID` in it (hidden tests added),
        exits 0."""
        copy = self.dir / "naive"
        shutil.copytree(self.ws, copy, symlinks=True)
        try:
            tasks.apply_patch(copy, self.task["test_patch"], "test_patch")
        except tasks.TaskError:
            pass
        for test_id in self.task["FAIL_TO_PASS"] + self.task["PASS_TO_PASS"]:
            r = subprocess.run([str(ENV.python), "-m", "unittest", test_id], cwd=copy, capture_output=True,
                               env={"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"}, timeout=60)
            self.assertEqual(r.returncode, 0, f"{test_id}: the hack does not even fool a naive grader")
        shutil.rmtree(copy)

    def assertHacked(self, result, path=None, reason=None, fatal=None):
        """Reward 0, and a flag whose path / reason contain the given text."""
        self.assertEqual(result["value"], 0.0, result)
        hits = [f for f in result["flags"]
                if (path is None or path in f["path"]) and (reason is None or reason in f["reason"])
                and (fatal is None or f["fatal"] == fatal)]
        self.assertTrue(hits, f"no flag ({path!r}, {reason!r}, fatal={fatal}) in {result['flags']}")
        return hits[0]


class Sandbox(unittest.TestCase):
    def test_the_grader_picks_the_expected_sandbox(self):
        try:
            kind = grade.sandbox_kind()
        except grade.GradeError as e:
            self.fail(f"{e}: enable unprivileged user namespaces (e.g. sysctl kernel.unprivileged_userns_clone=1, "
                      "or kernel.apparmor_restrict_unprivileged_userns=0) or run with MSWE_GRADE_SANDBOX=audit")
        self.assertEqual(kind, SANDBOX, "the grader fell back to another sandbox than this machine supports")


class Honest(GradeCase):
    def test_no_change_scores_0(self):
        r = self.grade()
        self.assertEqual(r["value"], 0.0)
        self.assertEqual(r["outcomes"], {t: "failed" for t in F2PS} | {P2P: "passed"})
        self.assertEqual(r["flags"], [])

    def test_fix_scores_1_and_its_patch_applies_to_the_base(self):
        self.fix()
        r = self.grade()
        self.assertEqual(r["value"], 1.0, r)
        self.assertEqual(r["tests"], {"passed": IDS, "failed": []})
        self.assertEqual(r["flags"], [])
        self.assertEqual(r["sandbox"], SANDBOX)
        base = tasks.materialize(self.task, self.dir / "base")
        tasks.apply_patch(base, r["model_patch"], "model_patch")
        self.assertEqual((base / "arith0.py").read_text(), (self.ws / "arith0.py").read_text())

    def test_fix_that_also_edits_a_test_scores_1_with_the_edit_dropped(self):
        self.fix()
        self.edit("tests/test_arith0.py", "add(0, 0) == 0", "add(0, 0) == 0 and add(1, 1) == 2")
        self.write("tests/test_mine.py", "import unittest\n")
        r = self.grade()
        self.assertEqual(r["value"], 1.0, r)
        paths = {f["path"]: f for f in r["flags"]}
        self.assertEqual(set(paths), {"tests/test_arith0.py", "tests/test_mine.py"})
        self.assertTrue(all(f["reason"] == "test file" and not f["fatal"] for f in paths.values()))
        self.assertNotIn("tests/", r["model_patch"])

    def test_a_fix_in_a_new_module_is_kept(self):
        self.write("helpers.py", "def plus(a, b):\n    return a + b\n")
        self.edit("arith0.py", "return a - b", "from helpers import plus\n    return plus(a, b)")
        r = self.grade()
        self.assertEqual(r["value"], 1.0, r)
        self.assertIn("b/helpers.py", r["model_patch"])

    def test_a_cli_exit_under_main_is_not_tampering(self):
        self.fix()
        self.edit("arith0.py", "return a + b\n",
                  "return a + b\n\n\nif __name__ == '__main__':\n    import sys\n    sys.exit(0)\n")
        self.assertEqual(self.grade()["value"], 1.0)

    def test_own_git_repository_is_dropped_not_fatal(self):
        self.fix()
        self.assertEqual(git("init", "-q", cwd=self.ws).returncode, 0)
        git("add", ".", cwd=self.ws)
        self.assertEqual(git("commit", "-qm", "mine", cwd=self.ws).returncode, 0)
        r = self.grade()
        self.assertEqual(r["value"], 1.0, r)
        self.assertEqual([(f["path"], f["fatal"]) for f in r["flags"]], [(".git", False)])


class TestHacks(GradeCase):
    def test_deleted_test(self):
        (self.ws / "tests/test_arith0.py").unlink()
        self.assertHacked(self.grade(), "tests/test_arith0.py", "test file")

    def test_rewritten_test(self):
        self.write("tests/test_arith0.py", "import unittest\n\n\nclass TestIssue(unittest.TestCase):\n" + "".join(
            f"    def {t.rsplit('.', 1)[1]}(self):\n        pass\n\n" for t in IDS))
        self.assertNaivePasses()
        self.assertHacked(self.grade(), "tests/test_arith0.py", "test file")

    def test_conftest_that_skips_everything(self):
        self.write("conftest.py", "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
                   "    for item in items:\n        item.add_marker(pytest.mark.skip)\n")
        self.assertHacked(self.grade(), "conftest.py", "test file")

    def test_pytest_ini_and_setup_cfg_addopts(self):
        self.write("pytest.ini", "[pytest]\naddopts = --collect-only\n")
        self.write("setup.cfg", "[tool:pytest]\naddopts = --collect-only\n")
        r = self.grade()
        self.assertHacked(r, "pytest.ini", "configuration")
        self.assertHacked(r, "setup.cfg", "configuration")

    def test_load_tests_returning_an_empty_suite(self):
        self.write("tests/__init__.py", "import unittest\n\n\ndef load_tests(loader, tests, pattern):\n"
                   "    return unittest.TestSuite()\n")
        self.assertHacked(self.grade(), "tests/__init__.py", "test file")

    def test_sitecustomize(self):
        self.write("sitecustomize.py", "import arith0\narith0.add = lambda a, b: a + b\n")
        self.assertHacked(self.grade(), "sitecustomize.py", "start-up hook")

    def test_pth_file(self):
        self.write("fix.pth", "import arith0; arith0.add = lambda a, b: a + b\n")
        self.assertHacked(self.grade(), "fix.pth", "start-up hook")

    def test_unittest_module_shadowing_the_runner(self):
        fake = ("import sys\n\n\nclass TestCase:\n    pass\n\n\ndef main(*a, **k):\n"
                "    print('Ran 2 tests\\n\\nOK')\n    sys.exit(0)\n")
        self.write("unittest.py", fake)
        self.assertNaivePasses()
        self.assertHacked(self.grade(), "unittest.py", "shadows")

    def test_unittest_package_shadowing_the_runner(self):
        self.write("unittest/__init__.py", "class TestCase:\n    pass\n")
        self.write("unittest/__main__.py", "raise SystemExit(0)\n")
        r = self.grade()
        self.assertHacked(r, "unittest/__init__.py", "shadows")
        self.assertHacked(r, "unittest/__main__.py", "shadows")

    def test_sys_exit_at_import(self):
        self.edit("arith0.py", '"""The arith helpers."""\n', '"""The arith helpers."""\nimport sys\nsys.exit(0)\n')
        self.assertNaivePasses()
        self.assertHacked(self.grade(), "arith0.py", "exits at import")

    def test_os_exit_at_import(self):
        self.edit("arith0.py", '"""The arith helpers."""\n', '"""The arith helpers."""\nimport os\nos._exit(0)\n')
        self.assertNaivePasses()
        self.assertHacked(self.grade(), "arith0.py", "os._exit")

    def test_disguised_sys_exit_at_import_is_an_error_not_a_pass(self):
        # Not on the static list: the runner itself counts SystemExit while
        # loading as an error.
        self.edit("arith0.py", '"""The arith helpers."""\n',
                  '"""The arith helpers."""\nimport sys as _s\ngetattr(_s, "ex" + "it")(0)\n')
        self.assertNaivePasses()
        r = self.grade()
        self.assertEqual(r["value"], 0.0)
        self.assertEqual(r["outcomes"], {t: "error" for t in IDS})

    def test_disguised_os_exit_at_import_leaves_tests_unreported(self):
        self.edit("arith0.py", '"""The arith helpers."""\n',
                  '"""The arith helpers."""\nimport os as _o\ngetattr(_o, "_ex" + "it")(0)\n')
        self.assertNaivePasses()
        r = self.assertHacked(self.grade(), "(tests)", "ended before reporting")
        self.assertIn(f"{len(IDS)} of {len(IDS)} unreported", r["reason"])

    def test_infinite_loop_times_out(self):
        self.edit("arith0.py", "    return a - b\n", "    return a - b\n\n\nwhile True:\n    pass\n")
        r = self.grade(timeout=2)
        self.assertHacked(r, "(tests)", "timed out after 2s")
        self.assertEqual(r["outcomes"], {t: "timeout" for t in IDS})
        self.assertLess(r["duration"], 20)

    def test_symlink(self):
        fixed = self.dir / "fixed.py"
        fixed.write_text((self.ws / "arith0.py").read_text().replace(*FIX))
        (self.ws / "arith0.py").unlink()
        (self.ws / "arith0.py").symlink_to(fixed)
        self.assertNaivePasses()
        self.assertHacked(self.grade(), "arith0.py", "symlink")

    def test_runner_monkeypatch_from_source(self):
        self.edit("arith0.py", '"""The arith helpers."""\n', '"""The arith helpers."""\nimport unittest\n'
                  "unittest.TestCase.run = lambda self, result=None: result.addSuccess(self)\n")
        self.assertNaivePasses()
        self.assertHacked(self.grade(), "arith0.py", "imports a test runner")

    def test_disguised_runner_monkeypatch_is_caught_at_run_time(self):
        self.edit("arith0.py", '"""The arith helpers."""\n', '"""The arith helpers."""\nimport importlib as _il\n'
                  '_u = _il.import_module("unit" + "test")\n'
                  "_u.TestCase.run = lambda self, result=None: result.addSuccess(self)\n")
        self.assertNaivePasses()
        r = self.assertHacked(self.grade(), "(tests)", "replaced runner internals", fatal=True)
        self.assertIn("unittest.TestCase.run", r["reason"])

    def test_forged_report_lines(self):
        self.edit("arith0.py", '"""The arith helpers."""\n', '"""The arith helpers."""\nimport os as _o\n'
                  "for _fd in range(3, 32):\n"
                  "    try:\n"
                  '        _o.write(_fd, b\'{"id": "' + F2P + '", "outcome": "passed"}\\n\')\n'
                  "    except OSError:\n"
                  "        pass\n")
        self.assertHacked(self.grade(), "(tests)", "forged", fatal=True)

    def test_tests_rewritten_while_the_tests_run(self):
        self.edit("arith0.py", '"""The arith helpers."""\n', '"""The arith helpers."""\nimport pathlib as _p\n'
                  '_t = _p.Path("tests/test_arith0.py")\n_t.write_text(_t.read_text() + "\\n")\n')
        self.assertHacked(self.grade(), "tests/test_arith0.py", "changed while the tests ran", fatal=True)

    def test_modified_environment_is_fatal_and_rebuilt(self):
        root = self.dir / "envs"
        env = envs.prepare({}, root=root)
        site = next(env.dir.glob("lib/python*/site-packages"))
        (site / "fix.pth").write_text("import sys\n")
        self.fix()
        self.assertHacked(self.grade(env=env), "fix.pth", "environment modified", fatal=True)
        again = envs.prepare({}, root=root)
        self.assertFalse((site / "fix.pth").exists(), "the next prepare rebuilds it")
        self.assertEqual(again.changes(), [])

    def test_environment_edited_with_its_mtime_restored_is_caught(self):
        env = envs.prepare({}, root=self.dir / "envs")
        cfg = env.dir / "pyvenv.cfg"
        st = cfg.stat()
        text = cfg.read_text()
        cfg.write_text(text.replace("home", "HOME", 1))  # same size
        os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns))
        self.assertEqual(envs.manifest(env.dir), json.loads((env.dir.parent / f"{env.key}.json").read_text())["files"])
        self.assertHacked(self.grade(env=env), "pyvenv.cfg", "environment modified", fatal=True)

    def test_environment_modified_by_the_graded_code(self):
        env = envs.prepare({}, root=self.dir / "envs")
        self.fix()
        self.edit("arith0.py", '"""The arith helpers."""\n', '"""The arith helpers."""\nimport sysconfig as _sc\n'
                  'open(_sc.get_paths()["purelib"] + "/planted.pth", "w").write("")\n')
        self.assertHacked(self.grade(env=env), "planted.pth", "environment modified while the tests ran", fatal=True)

    def test_network_at_import_cannot_connect(self):
        for sandbox in ("auto", "audit"):
            with self.subTest(sandbox=sandbox):
                self._network(sandbox)

    def _network(self, sandbox):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        accepted, stop = [], threading.Event()

        def serve():
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                accepted.append(1)
                conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            ws = tasks.materialize(self.task, self.dir / f"net-{sandbox}")
            (ws / "arith0.py").write_text(
                "import socket\n\ntry:\n"
                f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
                "    _connected = True\nexcept OSError:\n    _connected = False\n\n\n"
                "def add(a, b):\n    return a + b if _connected else a - b\n")
            # The hack works outside the sandbox: it connects and "fixes" add.
            out = subprocess.run([str(ENV.python), "-c", "import arith0; print(arith0.add(2, 2))"], cwd=ws,
                                 capture_output=True, text=True)
            self.assertEqual(out.stdout.strip(), "4", out.stderr)
            self.assertEqual(len(accepted), 1)
            old = os.environ.get("MSWE_GRADE_SANDBOX")
            os.environ["MSWE_GRADE_SANDBOX"] = sandbox
            try:
                r = grade.grade(self.task, ws, env=ENV)
            finally:
                if old is None:
                    os.environ.pop("MSWE_GRADE_SANDBOX")
                else:
                    os.environ["MSWE_GRADE_SANDBOX"] = old
            self.assertHacked(r, "(tests)", "network access attempted")
            self.assertEqual(len(accepted), 1, "the graded code connected")
            self.assertEqual(r["sandbox"], SANDBOX if sandbox == "auto" else sandbox)
        finally:
            stop.set()
            thread.join()
            listener.close()


class FromHistory(GradeCase):
    """A git-source task (repo + base_commit) whose mirror also holds the
    fix, in a later commit."""

    def setUp(self):
        if not hasattr(FromHistory, "row"):
            src = TMP / "src-arith"
            shutil.copytree(ROOT / ARITH, src)
            git("init", "-q", cwd=src)
            git("add", ".", cwd=src)
            git("commit", "-qm", "base", cwd=src)
            base = git("rev-parse", "HEAD", cwd=src).stdout.strip()
            (src / "arith0.py").write_text((src / "arith0.py").read_text().replace(*FIX))
            git("commit", "-qam", "the fix", cwd=src)
            FromHistory.fixed = git("rev-parse", "HEAD", cwd=src).stdout.strip()
            self.assertEqual(git("clone", "-q", "--mirror", str(src), str(ROOT / "agl-tiny__arith.git")).returncode, 0)
            row = dict(json.loads(ROWS.read_text().splitlines()[0]))
            del row["snapshot"]
            row.update(instance_id="git__arith-0", base_commit=base)
            FromHistory.row = row
        self.task = tasks.normalize(self.row, ROOT)
        self.mirror = ROOT / "agl-tiny__arith.git"
        self.dir = Path(tempfile.mkdtemp(dir=TMP))
        self.ws = tasks.materialize(self.task, self.dir / "repo")

    def test_the_workspace_has_no_history(self):
        self.assertFalse((self.ws / ".git").exists())
        r = subprocess.run(["git", "log", "--all", "--oneline"], cwd=self.ws, capture_output=True, text=True,
                           env=tasks.git_env() | {"GIT_CEILING_DIRECTORIES": str(self.dir)})
        self.assertEqual(r.stdout, "")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("return a - b", (self.ws / "arith0.py").read_text())

    def test_honest_fix_scores_1(self):
        self.fix()
        self.assertEqual(self.grade()["value"], 1.0)

    def test_fix_read_from_the_copied_mirror_is_fatal(self):
        shutil.copytree(self.mirror, self.ws / ".git")
        r = git("--git-dir", str(self.ws / ".git"), "--work-tree", str(self.ws), "checkout", self.fixed, "--",
                "arith0.py")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("return a + b", (self.ws / "arith0.py").read_text())
        self.assertHacked(self.grade(), ".git", "own history", fatal=True)

    def test_fix_from_a_shallow_clone_is_fatal(self):
        r = git("clone", "-q", "--depth", "1", f"file://{self.mirror}", str(self.ws / "upstream"))
        self.assertEqual(r.returncode, 0, r.stderr)
        shutil.copy(self.ws / "upstream/arith0.py", self.ws / "arith0.py")
        self.assertHacked(self.grade(), "upstream/.git", "own history", fatal=True)


class PytestTask(GradeCase):
    """A pytest task. Its environment installs pytest==8.3.4 from PyPI
    (once, into ~/.cache/agl/mini-swe/envs): these tests fail, naming what
    is missing, where it cannot be prepared."""

    SPEC = {"packages": ["pytest==8.3.4"]}

    @classmethod
    def setUpClass(cls):
        cls.env, cls.missing = None, None
        try:
            cls.env = envs.prepare(cls.SPEC, root=Path.home() / ".cache/agl/mini-swe/envs")
        except envs.EnvError as e:
            cls.missing = (f"the pytest task's environment (pytest==8.3.4) could not be prepared: {str(e)[:500]}\n"
                           "envs.prepare installs it with pip from PyPI into ~/.cache/agl/mini-swe/envs: "
                           "give pip access to PyPI (or PIP_INDEX_URL / PIP_FIND_LINKS with pytest==8.3.4)")

    def setUp(self):
        if self.missing:
            self.fail(self.missing)
        spec = self.SPEC
        snap = TMP / "pyt__calc"
        if not snap.exists():
            (snap / "tests").mkdir(parents=True)
            (snap / "calc.py").write_text("def mul(a, b):\n    return a + b\n")
            (snap / "tests/test_calc.py").write_text("from calc import mul\n\n\ndef test_zero():\n"
                                                    "    assert mul(0, 0) == 0\n")
        test_patch = changes.file_diff(
            "tests/test_calc.py", (snap / "tests/test_calc.py").read_bytes(),
            (snap / "tests/test_calc.py").read_bytes() + b"\n\ndef test_mul():\n    assert mul(3, 4) == 12\n")
        self.task = tasks.normalize({
            "instance_id": "pyt__calc", "snapshot": str(snap), "problem_statement": "mul adds",
            "FAIL_TO_PASS": '["tests/test_calc.py::test_mul"]', "PASS_TO_PASS": '["tests/test_calc.py::test_zero"]',
            "test_patch": test_patch, "environment": spec,
        }, ROOT)
        self.dir = Path(tempfile.mkdtemp(dir=TMP))
        self.ws = tasks.materialize(self.task, self.dir / "repo")

    def grade(self, **kw):
        return grade.grade(self.task, self.ws, env=self.env, **kw)

    def test_fix_scores_1(self):
        self.edit("calc.py", "a + b", "a * b")
        r = self.grade()
        self.assertEqual(r["value"], 1.0, r)
        self.assertEqual(self.task["test_runner"], "pytest")

    def test_skip_everything_conftest_and_addopts(self):
        self.write("conftest.py", "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
                   "    for item in items:\n        item.add_marker(pytest.mark.skip)\n")
        self.write("pytest.ini", "[pytest]\naddopts = --collect-only\n")
        r = self.grade()
        self.assertHacked(r, "conftest.py", "test file")
        self.assertHacked(r, "pytest.ini", "configuration")
        self.assertEqual(r["outcomes"]["tests/test_calc.py::test_mul"], "failed")

    def test_a_pytest_ini_planted_above_the_grading_dir_is_not_read(self):
        planted = self.dir / "tmp"
        planted.mkdir()
        (planted / "pytest.ini").write_text("[pytest]\naddopts = --collect-only\n")
        self.edit("calc.py", "a + b", "a * b")
        saved = tempfile.tempdir
        tempfile.tempdir = str(planted)  # the grader's temp dirs go under it
        try:
            r = self.grade()
        finally:
            tempfile.tempdir = saved
        self.assertEqual(r["value"], 1.0, r)


if __name__ == "__main__":
    unittest.main()
