"""hhost's read (benchmarks/eager_host_read.py): the ledger's eager prices per row, what each lease's files say about
its host, and the registered tests of benchmarks/results/2026-11-27-eager-host-predicted/ on the committed raw."""

from __future__ import annotations

from benchmarks import eager_host_read as read


def test_every_row_with_eager_steps_gets_its_ledger_price() -> None:
    ratios = read.ledger_ratios(read.LEDGER.read_text())
    assert len(ratios) == 11 and ratios["h200x2-v2lite-pd-product-warm"] == 1.02
    assert ratios["h100x2-v2lite-agg-tp1-product-mem065-inrun-lease7"] == 1.71
    assert "h100x2-v2lite-agg-tp2-mem080-graphs1024-lease4" not in ratios  # no eager steps: a dash, not a price


def test_a_manifest_s_machine_report_is_read_and_a_hand_written_one_only_for_its_gpu() -> None:
    vm = read.machine_props("vm: Linux-6.18.44-fc-v657-gpu-x86_64-with-glibc2.39, 32 cores (Intel(R) Xeon(R) Processor), "
                            "252 GiB RAM, load average 1.13, 1.14, 0.66 at the start",
                            "2 x NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04")
    assert vm == {"GPU kind": "H100", "driver": "580.159.04", "vCPUs": 32.0, "CPU model": "Intel(R) Xeon(R) Processor",
                  "RAM GiB": 252.0, "kernel": "6.18.44-fc-v657-gpu", "load avg 1 min at the call's start": 1.13}
    by_hand = read.machine_props("lent nvidia-h200-x2: one host, 32 cores, 256 GiB RAM, Linux (the device image)",
                                 "2 x NVIDIA H200 (143,771 MiB each), NVLink, driver 580.159.04 (lent nvidia-h200-x2)")
    assert by_hand == {"GPU kind": "H200", "driver": "580.159.04"}


def test_spearman_and_the_leave_one_out_line() -> None:
    assert read.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert read.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert read.spearman([1, 1, 1], [1, 2, 3]) is None
    line, const = read.loo_errors([1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 4.0, 6.0, 8.0, 10.0])
    assert line < 1e-9 < const


def test_on_the_committed_raw_no_recorded_host_property_explains_the_price() -> None:
    hosts = read.load_hosts(read.ledger_ratios(read.LEDGER.read_text()))
    assert [h.name for h in hosts] == [f"H{i}" for i in range(1, 8)]
    ok, text = read.test_property(hosts, "GPU kind")
    assert ok is False and "H200: x1.02-1.63" in text and "H100: x1.48-1.71" in text  # the groups overlap
    assert read.test_property(hosts, "driver")[0] is None  # one value on every host: not testable
    assert not any(read.test_property(hosts, p)[0] for p in {p for h in hosts for p in h.props})
    assert read.within_host_share(hosts) < read.WITHIN_CAP
