#!/usr/bin/env python3
"""The dashboard in a real browser: headless Chromium driven by Selenium (Debian's chromium,
chromium-driver and python3-selenium) against a live gatehouse-controller.

The evidence is real: gatehouse-worker runs the llama family's gates on the llama-tiny-untied
fixture (fp32 and bf16), and its events, log and plot data are stored as the cells' attempts,
the way the controller stores what an agent relays (docs/protocols.md §4, §7). A running
attempt's log grows while the page is open. Checked, on drawn elements rather than on page
loads: the matrix's squares and a filter, a cell page's phase strip, plots (one KL line per
prompt with a point per position, the loss per step against upstream's), decode table and
artifacts, the live log following new bytes without a reload, compare highlighting a changed
figure, the agents page, and a controller with tokens asking for one. Each page is kept as a
screenshot under --screenshots. Then --bulk-cells synthetic cells are added and the matrix's
API time, bytes and time to render in the browser are printed (figures, not a pass bar).

Exit 0: passed; 77: SKIPPED (a tool is missing; the reason is printed); else failed.
"""
import argparse
import array
import gzip
import hashlib
import json
import os
import shutil
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SKIP = 77
REPO = "https://git.example/team/llama-adapter.git"
PHASES = ["config", "construct", "load", "inference", "decode", "training", "save"]


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def now_iso(offset_s=0.0):
    t = time.time() + offset_s
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


def cell_spec(args, precision, commit, tp=1, family="llama", checkpoint=None):
    fixture = os.path.join(args.build, "testdata", "llama-tiny-untied")
    return {
        "spec_version": 1, "repository": REPO, "commit": commit, "model_family": family,
        # Digests stand in (the identity gate, which checks them, is not run here); another
        # checkpoint has another.
        "checkpoint": {"path": checkpoint or os.path.join(fixture, "checkpoint"),
                       "digest": "sha256:" + ("e" if checkpoint else "c") * 64},
        "reference": {"path": os.path.join(fixture, "reference"), "digest": "sha256:" + "d" * 64},
        "runtime": {"torch": "2.11.0", "device": "cpu"},
        "launch": {"runner": "gatehouse-worker", "processes_per_rank": 1},
        "topology": {"tp": tp, "dp": 1, "pp": 1, "ep": 1},
        "precision": precision, "mode": "eager",
        "decode": {"max_new_tokens": 32, "sampling": "greedy"},
        "training": {"steps": 2, "lr": 0.001, "seed": 1234},
        "env": {}, "phases": PHASES,
    }


def scaled_query_checkpoint(args, tmp):
    """The fixture with layer 0's q_proj weight tripled: attention scores change wherever a
    position attends to more than itself, so upstream's logits are missed from position 1 on."""
    src = os.path.join(args.build, "testdata", "llama-tiny-untied", "checkpoint")
    dst = os.path.join(tmp, "checkpoint-scaled-q")
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    raw = bytearray(open(path, "rb").read())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    t = header["model.layers.0.self_attn.q_proj.weight"]
    assert t["dtype"] == "F32", t
    begin, end = (8 + n + o for o in t["data_offsets"])
    values = array.array("f", bytes(raw[begin:end]))
    raw[begin:end] = array.array("f", (3.0 * v for v in values)).tobytes()
    open(path, "wb").write(raw)
    return dst


def run_worker(args, tmp, precision, checkpoint=None, name=None, phases=PHASES):
    """The real gates on the fixture: (events, stderr log, attempt dir)."""
    name = name or precision
    attempt_dir = os.path.join(tmp, f"attempt-{name}")
    os.makedirs(attempt_dir)
    spec = cell_spec(args, precision, "0" * 40, checkpoint=checkpoint)
    spec["attempt"] = {"id": 1, "dir": attempt_dir, "agent": "dashboard-test",
                       "checkout": {"head": "0" * 40, "clean": True, "path": tmp}}
    run_json = os.path.join(tmp, f"run-{name}.json")
    with open(run_json, "w") as f:
        json.dump(spec, f)
    worker = os.path.join(args.build, "bin", "gatehouse-worker")
    plugin = os.path.join(args.build, "lib", "libgatehouse_models.so")
    p = subprocess.run([worker, "--run-spec", run_json, "--plugin", plugin],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"gatehouse-worker exited {p.returncode}: {p.stderr[-2000:]}")
    events = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    ends = {e["phase"]: e["status"] for e in events if e["event"] == "phase_end"}
    if phases is PHASES:
        assert all(ends.get(ph) == "PASS" for ph in PHASES), f"{name}: phases {ends}"
    return events, p.stderr, attempt_dir


class Seeder:
    """Stores cells, attempts, evidence, logs and artifacts as the controller's store does."""

    def __init__(self, db_path, artifact_dir):
        self.db = sqlite3.connect(db_path, timeout=30, isolation_level=None)
        self.artifact_dir = artifact_dir

    def cell(self, spec, branch, created_at, submitter="ci"):
        spec_json = json.dumps(spec, sort_keys=True, separators=(",", ":"))
        cell_id = hashlib.sha256(spec_json.encode()).hexdigest()
        self.db.execute(
            "INSERT INTO cells(id, spec_json, repository, commit_sha, branch, model_family, "
            "created_at, submitter, priority) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
            (cell_id, spec_json, spec["repository"], spec["commit"], branch, spec["model_family"],
             created_at, submitter))
        return cell_id

    def attempt(self, cell_id, state, agent, created_at, ended=True):
        cur = self.db.execute(
            "INSERT INTO attempts(cell_id, number, state, agent_id, created_at, started_at, "
            "ended_at, run_status) VALUES (?, 1, ?, ?, ?, ?, ?, ?)",
            (cell_id, state, agent, created_at, created_at, now_iso() if ended else "",
             {"passed": "PASS", "failed": "FAIL"}.get(state, "")))
        return cur.lastrowid

    def events(self, attempt_id, events, attempt_dir, until=None):
        """Applies worker events in order; stops after phase `until` has started."""
        for seq, e in enumerate(events, 1):
            kind = e["event"]
            self.db.execute("INSERT INTO events(attempt_id, seq, json, received_at) VALUES (?, ?, ?, ?)",
                            (attempt_id, seq, json.dumps(e), now_iso()))
            if kind == "phase_start":
                self.db.execute("INSERT INTO phases(attempt_id, phase, status, started_at) "
                                "VALUES (?, ?, 'RUNNING', ?)", (attempt_id, e["phase"], now_iso()))
                if e["phase"] == until:
                    return
            elif kind == "figure":
                self.db.execute("INSERT INTO figures(attempt_id, phase, name, value_json, unit) "
                                "VALUES (?, ?, ?, ?, ?)",
                                (attempt_id, e["phase"], e["name"], json.dumps(e["value"]), e.get("unit", "")))
            elif kind == "phase_end":
                self.db.execute("UPDATE phases SET status = ?, reason = ?, classification = ?, "
                                "ended_at = ?, duration_ms = ? WHERE attempt_id = ? AND phase = ?",
                                (e["status"], e.get("reason", ""), e.get("classification", ""),
                                 now_iso(), e.get("duration_ms"), attempt_id, e["phase"]))
            elif kind == "artifact" and e["path"].endswith("kl_by_position.json"):
                self.artifact(attempt_id, e["path"], os.path.join(attempt_dir, e["path"]))

    def artifact(self, attempt_id, name, path):
        data = open(path, "rb").read()
        hexd = hashlib.sha256(data).hexdigest()
        blob = os.path.join(self.artifact_dir, "sha256", hexd[:2], hexd)
        os.makedirs(os.path.dirname(blob), exist_ok=True)
        with open(blob, "wb") as f:
            f.write(data)
        self.db.execute("INSERT OR IGNORE INTO artifact_blobs(digest, size, created_at, last_used_at) "
                        "VALUES (?, ?, ?, ?)", ("sha256:" + hexd, len(data), now_iso(), now_iso()))
        self.db.execute("INSERT INTO artifacts(attempt_id, name, digest, size, created_at) "
                        "VALUES (?, ?, ?, ?, ?)", (attempt_id, name, "sha256:" + hexd, len(data), now_iso()))

    def log(self, attempt_id, text, stream="worker"):
        row = self.db.execute("SELECT coalesce(max(offset + length(data)), 0) FROM logs "
                              "WHERE attempt_id = ? AND stream = ?", (attempt_id, stream)).fetchone()
        self.db.execute("INSERT INTO logs(attempt_id, stream, offset, data) VALUES (?, ?, ?, ?)",
                        (attempt_id, stream, row[0], text.encode()))


class Controller:
    def __init__(self, args, tmp, name, auth="none"):
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir)
        self.db = os.path.join(self.dir, "gatehouse.db")
        self.artifacts = os.path.join(self.dir, "artifacts")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.bin = os.path.join(args.build, "bin", "gatehouse-controller")
        self.proc = subprocess.Popen(
            [self.bin, "--db", self.db, "--http", f"127.0.0.1:{self.port}",
             "--grpc", f"127.0.0.1:{free_port()}", "--auth", auth,
             "--web-dir", os.path.join(args.source, "web"), "--artifact-dir", self.artifacts,
             "--mirror-dir", os.path.join(self.dir, "mirrors"), "--heartbeat-ms", "600000"],
            stdout=open(os.path.join(self.dir, "controller.log"), "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                sys.exit(f"controller {name} did not start: " + open(os.path.join(self.dir, "controller.log")).read()[-2000:])
            time.sleep(0.2)

    def get(self, path, token=None, headers=None):
        headers = dict(headers or {})
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.url + path, headers=headers)
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.read()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wait_for(driver, what, predicate, timeout=20):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = predicate(driver)
            if last:
                return last
        except Exception as e:  # a node replaced between find and read: try again
            last = e
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--screenshots", required=True)
    ap.add_argument("--bulk-cells", type=int, default=20000)
    args = ap.parse_args()
    args.build, args.source = os.path.abspath(args.build), os.path.abspath(args.source)

    chromium = shutil.which("chromium")
    chromedriver = shutil.which("chromedriver")
    if not chromium or not chromedriver:
        skip("headless Chromium needs Debian's chromium and chromium-driver (deploy/setup.sh installs them)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
    except ImportError:
        skip("python3-selenium (Debian) is not installed")
    if not os.path.isdir(os.path.join(args.build, "testdata", "llama-tiny-untied")):
        sys.exit("no fixture llama-tiny-untied: run the make_testdata test first")

    os.makedirs(args.screenshots, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="gh-dashboard-")
    controllers = []
    driver = None
    try:
        t0 = time.time()
        fp32 = run_worker(args, tmp, "fp32")
        bf16 = run_worker(args, tmp, "bf16")
        broken_ckpt = scaled_query_checkpoint(args, tmp)
        broken = run_worker(args, tmp, "fp32", checkpoint=broken_ckpt, name="scaled-q", phases=None)
        broken_ends = {e["phase"]: e for e in broken[0] if e["event"] == "phase_end"}
        assert broken_ends["inference"]["status"] == "FAIL", broken_ends.get("inference")
        print(f"worker evidence (fp32, bf16, a scaled q_proj) in {time.time() - t0:.1f} s")

        ctl = Controller(args, tmp, "open")
        controllers.append(ctl)
        seed = Seeder(ctl.db, ctl.artifacts)
        c1, c2, c3 = "1" * 40, "2" * 40, "3" * 40
        a_id = seed.cell(cell_spec(args, "fp32", c1), "main", now_iso(-300))
        a_att = seed.attempt(a_id, "passed", "node-1", now_iso(-300))
        seed.events(a_att, fp32[0], fp32[2])
        seed.log(a_att, fp32[1])
        b_id = seed.cell(cell_spec(args, "bf16", c1), "main", now_iso(-290))
        b_att = seed.attempt(b_id, "passed", "node-1", now_iso(-290))
        seed.events(b_att, bf16[0], bf16[2])
        # A cell on a feature branch whose inference FAILed: its checkpoint's layer 0 queries are
        # tripled against the reference's (a row of its own: another checkpoint).
        f_id = seed.cell(cell_spec(args, "fp32", c2, checkpoint=broken_ckpt), "feature/qk", now_iso(-200))
        f_att = seed.attempt(f_id, "failed", "node-1", now_iso(-200))
        seed.events(f_att, broken[0], broken[2])
        # A running TP=2 attempt whose log grows while the page is open.
        r_id = seed.cell(cell_spec(args, "fp32", c3, tp=2), "main", now_iso(-100))
        r_att = seed.attempt(r_id, "running", "node-1", now_iso(-100), ended=False)
        seed.events(r_att, fp32[0], fp32[2], until="load")
        seed.log(r_att, "rank 0: building the adapter\n")
        q_id = seed.cell(cell_spec(args, "fp32", c1, family="qwen3"), "main", now_iso(-50))
        seed.db.execute("INSERT INTO attempts(cell_id, number, state, created_at) VALUES (?, 1, 'queued', ?)",
                        (q_id, now_iso(-50)))
        seed.db.execute(
            "INSERT INTO agents(id, name, capabilities_json, registered_at, last_heartbeat_at, state) "
            "VALUES ('node-1', 'node-1', ?, ?, ?, 'disconnected')",
            (json.dumps({"cpu_cores": 16, "memory_bytes": str(2048 * 2**30), "gpus": [{"index": 0, "model": "NVIDIA H200", "memory_bytes": str(141 * 2**30)},
                                                   {"index": 1, "model": "NVIDIA H200", "memory_bytes": str(141 * 2**30)}],
                         "labels": {"lane": "gpu", "sandbox": "bubblewrap 0.8.0",
                                    "cgroup": "none: gatehouse-agent --cgroup none"}}),
             now_iso(-400), now_iso(-10)))

        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--window-size=1400,1000", "--user-data-dir=" + os.path.join(tmp, "chrome")):
            opts.add_argument(a)
        driver = webdriver.Chrome(service=Service(chromedriver), options=opts)
        driver.set_page_load_timeout(60)
        shot = lambda name: driver.save_screenshot(os.path.join(args.screenshots, name))
        loaded = lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "true"

        # --- the matrix --------------------------------------------------------------------
        driver.get(ctl.url)
        wait_for(driver, "matrix squares", lambda d: len(d.find_elements(By.CSS_SELECTOR, "a.square")) == 5)
        squares = {e.get_attribute("data-cell"): e.get_attribute("data-status")
                   for e in driver.find_elements(By.CSS_SELECTOR, "a.square")}
        assert squares == {a_id: "passed", b_id: "passed", r_id: "running", f_id: "failed", q_id: "queued"}, squares
        rows = driver.find_elements(By.CSS_SELECTOR, "#matrix tbody tr")
        assert [r.get_attribute("data-family") for r in rows] == ["llama", "llama", "qwen3"], rows
        by_cell = {r.find_element(By.CSS_SELECTOR, "a.square").get_attribute("data-cell"): r.text for r in rows}
        assert "failed" in by_cell[f_id] and "0 / 1 validated" in by_cell[f_id], by_cell[f_id]
        fixture_row = next(t for t in by_cell.values() if "2 / 3 validated" in t)
        assert "unverified" in fixture_row, fixture_row  # a square still running
        fail_sq = driver.find_element(By.CSS_SELECTOR, f"a.square[data-cell='{f_id}']")
        colour = fail_sq.value_of_css_property("background-color")
        assert colour in ("rgb(207, 34, 46)", "rgba(207, 34, 46, 1)"), f"a failed square is red, not {colour}"
        shot("matrix.png")
        # Filter: branch main shows commit 1's passed fp32 cell in that square instead.
        from selenium.webdriver.support.ui import Select
        Select(driver.find_element(By.NAME, "branch")).select_by_value("main")
        wait_for(driver, "branch filter", lambda d: len(d.find_elements(By.CSS_SELECTOR, "a.square")) == 4)
        assert "branch=main" in driver.current_url
        assert not driver.find_elements(By.CSS_SELECTOR, f"a.square[data-cell='{f_id}']")
        assert driver.find_elements(By.CSS_SELECTOR, f"a.square[data-cell='{a_id}']")
        Select(driver.find_element(By.NAME, "status")).select_by_value("running")
        wait_for(driver, "status filter", lambda d: [e.get_attribute("data-cell") for e in d.find_elements(By.CSS_SELECTOR, "a.square")] == [r_id])
        shot("matrix-filtered.png")
        print("matrix: 5 squares in 3 rows, branch and status filters: ok")

        # --- the cell list ----------------------------------------------------------------------
        driver.get(ctl.url + "cells.html")
        listed = wait_for(driver, "cell list", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#cells tbody tr")) == 5
                          and d.find_elements(By.CSS_SELECTOR, "#cells tbody tr"))
        assert listed[0].find_element(By.TAG_NAME, "a").get_attribute("title") == q_id, "newest first"
        shot("cells.png")

        # --- a cell page: strip, reasons, plots, decode, artifacts ---------------------------
        driver.get(ctl.url + f"cell.html?id={a_id}")
        wait_for(driver, "phase strip", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#phase-strip a.phase[data-status='PASS']")) == len(PHASES))
        inference = driver.find_element(By.CSS_SELECTOR, "a.phase[data-phase='inference']").text
        assert "kl_mean" in inference and "top1_agreement" in inference, inference
        kl = wait_for(driver, "KL plot", lambda d: d.find_elements(By.CSS_SELECTOR, "figure[data-plot='kl_inference'] path.series"))
        kl_data = json.load(open(os.path.join(fp32[2], "inference", "kl_by_position.json")))
        assert len(kl) == len(kl_data["prompts"]) >= 2, (len(kl), len(kl_data["prompts"]))
        for path, prompt in zip(kl, kl_data["prompts"]):
            assert int(path.get_attribute("data-points")) == len(prompt["kl"]), "a point per position"
            assert path.get_attribute("d").count("L") == len(prompt["kl"]) - 1
        loss = driver.find_elements(By.CSS_SELECTOR, "figure[data-plot='loss'] path.series")
        assert [p.get_attribute("data-name") for p in loss] == ["ours", "upstream"], loss
        decode_rows = driver.find_elements(By.CSS_SELECTOR, "#decode tbody tr")
        assert decode_rows and all(r.get_attribute("data-same") == "true" for r in decode_rows), "decode equals upstream"
        links = [a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "#artifacts a")]
        assert any("/api/v1/artifacts/sha256" in h for h in links), links
        shot("cell.png")
        print(f"cell page: {len(PHASES)} phases, KL plot {len(kl)} lines, loss plot, {len(decode_rows)} decode rows: ok")

        driver.get(ctl.url + f"cell.html?id={f_id}")
        reason = wait_for(driver, "FAIL reason", lambda d: d.find_elements(By.CSS_SELECTOR, "#reasons li[data-phase='inference']"))
        assert broken_ends["inference"]["reason"][:40] in reason[0].text, reason[0].text
        assert "adapter contract" in reason[0].text, reason[0].text
        # Its KL plot: zero at position 0 (a token attends only to itself there), above the
        # bar after it, the rise a query-side bug shows.
        kl_broken = json.load(open(os.path.join(broken[2], "inference", "kl_by_position.json")))
        assert all(p["kl"][0] < 1e-9 and max(p["kl"][1:]) > 1e-3 for p in kl_broken["prompts"]), kl_broken
        wait_for(driver, "the failed cell's KL plot",
                 lambda d: len(d.find_elements(By.CSS_SELECTOR, "figure[data-plot='kl_inference'] path.series")) == len(kl_broken["prompts"]))
        shot("cell-failed.png")
        driver.get(ctl.url + "cell.html")
        wait_for(driver, "a page without id", lambda d: "needs ?id=" in d.find_element(By.ID, "error").text)

        # --- the live log --------------------------------------------------------------------
        driver.get(ctl.url + f"cell.html?id={r_id}")
        wait_for(driver, "log", lambda d: "building the adapter" in d.find_element(By.ID, "log").text)
        driver.execute_script("window.__firstLogNode = document.getElementById('log').firstChild;")
        for i in range(3):
            seed.log(r_att, f"rank 0: step {i} of the load gate\n")
            wait_for(driver, f"log chunk {i}", lambda d: f"step {i} of the load gate" in d.find_element(By.ID, "log").text)
        same_node = driver.execute_script("return document.getElementById('log').firstChild === window.__firstLogNode;")
        assert same_node, "the log was replaced instead of appended to"
        offset = int(driver.find_element(By.ID, "log").get_attribute("data-offset"))
        stored = seed.db.execute("SELECT sum(length(data)) FROM logs WHERE attempt_id = ?", (r_att,)).fetchone()[0]
        assert offset == stored, (offset, stored)
        assert driver.find_element(By.CSS_SELECTOR, "a.phase[data-phase='load']").get_attribute("data-status") == "RUNNING"
        assert driver.find_element(By.CSS_SELECTOR, "a.phase[data-phase='save']").get_attribute("data-status") == "pending"
        driver.execute_script("document.getElementById('log').scrollIntoView();")
        shot("cell-live-log.png")
        print(f"live log: followed to byte {offset} by offset: ok")

        # --- compare ---------------------------------------------------------------------------
        driver.get(ctl.url + f"compare.html?a={a_id}&b={b_id}")
        wait_for(driver, "compare", lambda d: d.find_elements(By.CSS_SELECTOR, "#figures tr.changed"))
        # The bytes of the parameters halve in bf16 (fp32's logits are bit-equal to upstream's
        # on this fixture, so its KL is 0 in both cells and stays folded).
        changed = driver.find_element(By.CSS_SELECTOR, "#figures tr[data-figure='construct.param_bytes']")
        assert "changed" in changed.get_attribute("class").split(), "param_bytes differs between fp32 and bf16"
        assert "-50.0%" in changed.text, changed.text
        colour = changed.find_element(By.TAG_NAME, "td").value_of_css_property("background-color")
        assert colour in ("rgb(255, 243, 191)", "rgba(255, 243, 191, 1)"), f"a changed figure is highlighted, not {colour}"
        inputs = driver.find_element(By.ID, "inputs").text
        assert "precision" in inputs and "bf16" in inputs, inputs
        assert not driver.find_elements(By.CSS_SELECTOR, "#figures tr[data-figure='load.keys_used']"), "unchanged hidden"
        shot("compare.png")
        print("compare: construct.param_bytes highlighted, unchanged figures folded: ok")

        # --- agents ----------------------------------------------------------------------------
        driver.get(ctl.url + "agents.html")
        agent = wait_for(driver, "agent row", lambda d: d.find_elements(By.CSS_SELECTOR, "#agents tr[data-agent='node-1']"))
        assert "NVIDIA H200, 141 GiB" in agent[0].text and "gpu" in agent[0].text, agent[0].text
        assert "2048 GiB" in agent[0].text, agent[0].text  # the node's memory, as the scheduler sees it
        isolation = {li.get_attribute("data-isolation"): li
                     for li in agent[0].find_elements(By.CSS_SELECTOR, "li[data-isolation]")}
        assert isolation["sandbox"].text == "sandbox: bubblewrap 0.8.0", isolation["sandbox"].text
        assert isolation["cgroup"].text == "cgroup: none: gatehouse-agent --cgroup none", isolation["cgroup"].text
        assert "muted" in isolation["cgroup"].get_attribute("class").split()
        assert "muted" not in (isolation["sandbox"].get_attribute("class") or "").split()
        shot("agents.png")

        # --- a controller with tokens asks for one ----------------------------------------------
        locked = Controller(args, tmp, "locked", auth="tokens")
        controllers.append(locked)
        token = subprocess.run([locked.bin, "--db", locked.db, "tokens", "create", "--name", "dash",
                                "--kind", "api", "--scopes", "read"],
                               capture_output=True, text=True, check=True).stdout.strip()
        try:
            locked.get("api/v1/matrix")
            raise AssertionError("the locked controller answered without a token")
        except urllib.error.HTTPError as e:
            assert e.code == 401, e.code
        driver.get(locked.url)
        form = wait_for(driver, "token form", lambda d: d.find_element(By.ID, "token-form"))
        assert "token" in form.text and "401" in driver.find_element(By.ID, "error").text, form.text
        shot("token-asked.png")
        form.find_element(By.NAME, "token").send_keys(token)
        form.find_element(By.TAG_NAME, "button").click()
        wait_for(driver, "matrix after the token", lambda d: loaded(d) and not d.find_elements(By.ID, "token-form")
                 and d.find_element(By.ID, "error").get_attribute("hidden") is not None)
        assert driver.find_element(By.ID, "empty").is_displayed(), "the locked controller's (empty) matrix"
        shot("token-accepted.png")
        print("401: the page asked for a token and loaded with it: ok")

        # --- figures with many cells -------------------------------------------------------------
        if args.bulk_cells > 0:
            bulk(seed, args, args.bulk_cells)
            for attempt in range(2):
                t = time.time()
                body = ctl.get("api/v1/matrix")
                api_ms = (time.time() - t) * 1000
            data = json.loads(body)
            t = time.time()
            driver.get(ctl.url)
            wait_for(driver, "bulk matrix", lambda d: loaded(d) and len(d.find_elements(By.CSS_SELECTOR, "a.square")) > 100, timeout=120)
            render_ms = (time.time() - t) * 1000
            # What crossed the wire: the browser asked for gzip and got it (encoded < decoded).
            sizes = driver.execute_script(
                "const e = performance.getEntriesByType('resource').filter(r => r.name.includes('api/v1/matrix'));"
                "return e.length ? [e[e.length - 1].encodedBodySize, e[e.length - 1].decodedBodySize] : null;")
            assert sizes and 0 < sizes[0] < sizes[1], (sizes, len(body))
            packed = ctl.get("api/v1/matrix", headers={"Accept-Encoding": "gzip"})
            assert gzip.decompress(packed) == body, "the gzip answer is not the same matrix"
            n_sq = len(driver.find_elements(By.CSS_SELECTOR, "a.square"))
            weight = sum(os.path.getsize(os.path.join(args.source, "web", f)) for f in ("index.html", "app.js", "matrix.js", "style.css"))
            shot("matrix-bulk.png")
            print(f"FIGURES cells={args.bulk_cells + 5} rows={len(data['rows'])} columns={len(data['columns'])} "
                  f"squares={n_sq} matrix_api_ms={api_ms:.0f} matrix_json_bytes={len(body)} "
                  f"matrix_gzip_bytes={len(packed)} browser_matrix_transfer_bytes={sizes[0]} "
                  f"page_static_bytes={weight} time_to_render_ms={render_ms:.0f}")
        print("screenshots:", ", ".join(sorted(os.listdir(args.screenshots))))
        return 0
    finally:
        if driver is not None:
            driver.quit()
        for c in controllers:
            c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def bulk(seed, args, n):
    """n validation cells over 40 families x 5 checkpoints x 4 precisions/topologies, 3 repos."""
    t = time.time()
    states = ["passed", "passed", "passed", "failed", "error", "blocked", "queued"]
    seed.db.execute("BEGIN")
    for i in range(n):
        spec = cell_spec(args, ["fp32", "bf16"][(i // 200) % 2], f"{i:040x}", tp=1 + (i // 400) % 2,
                         family=f"family{i % 40:02d}")
        spec["checkpoint"]["digest"] = "sha256:" + f"{(i // 40) % 5:064x}"
        spec["checkpoint"]["path"] = f"/models/family{i % 40:02d}/ckpt{(i // 40) % 5}"
        spec["repository"] = f"https://git.example/team/adapter{i % 3}.git"
        created = now_iso(-100000 + i)
        cell_id = seed.cell(spec, ["main", "dev", f"feature/{i % 17}"][i % 3], created)
        seed.db.execute("INSERT INTO attempts(cell_id, number, state, created_at) VALUES (?, 1, ?, ?)",
                        (cell_id, states[i % len(states)], created))
    seed.db.execute("COMMIT")
    print(f"bulk: {n} cells stored in {time.time() - t:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
