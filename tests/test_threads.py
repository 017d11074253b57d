"""Threads: the cores a process may use, the pools held to one count and put back, small
jobs side by side, and numbers that do not depend on the count."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from test_pipeline import run_args

from causaldim import cli, threads


def test_the_cgroup_quota_caps_the_usable_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # v2: 1.5 cores -> 2 threads
    assert threads.usable_cores(tmp_path) == 2
    (tmp_path / "cpu.max").write_text("max 100000\n")  # no quota: the affinity mask
    assert threads.usable_cores(tmp_path) == 4
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()  # v1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert threads.usable_cores(tmp_path) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    assert threads.usable_cores(tmp_path) == 4


def test_limited_holds_torch_to_the_count_and_puts_it_back():
    before = torch.get_num_threads()
    with threads.limited(1) as used:
        assert torch.get_num_threads() == 1
        assert used.threads == 1 and used.chosen_by == "--threads"
    assert torch.get_num_threads() == before
    with threads.limited() as used:
        assert used.threads == used.usable_cores == threads.usable_cores()
        assert used.chosen_by.startswith("default")


def test_parallel_map_keeps_order_and_runs_nested_maps_serially():
    seen = []

    def inner(x):
        seen.append(torch.get_num_threads())  # one intra-op thread inside the pool
        return x * x

    with threads.limited(2):
        out = threads.parallel_map(lambda xs: threads.parallel_map(inner, xs), [[1, 2], [3, 4]])
    assert out == [[1, 4], [9, 16]]
    assert set(seen) == {1}
    assert threads.parallel_map(inner, []) == []


def _numbers(node, path=""):
    """Every number of a results.json by its path, leaving out what measures the run
    rather than the model (timings, throughput, the thread count, digests of them)."""
    skip = {"seconds", "started", "threads", "tokens_per_second", "sealed_sha256"}
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in skip and "throughput" not in key and "sha256" not in key:
                yield from _numbers(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _numbers(value, f"{path}/{i}")
    elif isinstance(node, float | int) and not isinstance(node, bool):
        yield path, float(node)


@pytest.mark.skipif(threads.usable_cores() < 2, reason="needs two usable cores")
def test_the_numbers_do_not_depend_on_the_thread_count(tmp_path, tiny_model, text_corpus):
    found, report = {}, {}
    for n in (1, 2):
        out = tmp_path / f"t{n}"
        args = [*run_args(tiny_model("llama"), text_corpus, out), "--threads", str(n)]
        assert cli.main(args) == 0
        results = json.loads((out / "results.json").read_text())
        assert results["threads"]["threads"] == n
        head = results["sigma"]["logits"]  # the corrections are computed, so compared
        assert head["erank_corrected"] is not None and head["erank_corrected_95"] is not None
        found[n] = dict(_numbers(results))
        # every printed digit, the run's folder, timings, threads and digests of bytes aside
        run_own = r"seconds: [^\n]*|\d+ thread\(s\)|sha256 [0-9a-f]{64}|[\d.]+ s \([\d.]+ min\)"
        text = (out / "report.md").read_text().replace(str(out), "OUT")
        report[n] = re.sub(run_own, "", text).splitlines()
    assert found[1].keys() == found[2].keys()
    differ = [
        (p, a, found[2][p])
        for p, a in found[1].items()
        if not math.isclose(a, found[2][p], rel_tol=1e-7, abs_tol=1e-9)
        and not (math.isnan(a) and math.isnan(found[2][p]))
    ]
    assert not differ, differ[:10]
    printed = [
        [(x, y) for x, y in zip(a.split(), b.split(), strict=False) if x != y]
        for a, b in zip(report[1], report[2], strict=True)
        if a != b
    ]
    assert not printed, printed[:5]


def test_a_thread_count_below_one_is_refused_before_any_work(tmp_path, capsys):
    assert cli.main(["run", "--threads", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--threads" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
