"""Terminal progress of a bench run: a `rich` Live panel, or plain periodic lines in quiet mode.

bench driver -> LiveView.phase(name) / LiveView.update(result) -> (rich Live | log lines) [+ BenchMetrics]

The view computes everything from the results it is given (no Prometheus needed), so it works the
same in a terminal, in CI and in `ray job submit` logs (quiet mode: no cursor control, one line per
interval and per phase change).
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from orchestrator.observe.metrics import BenchMetrics, canonical_phase, projected_finish
from orchestrator.observe.report import tpot_s
from orchestrator.stats import percentile
from orchestrator.phases import Phase
from orchestrator.records import RequestResult

RATE_WINDOW_S = 10.0  # "current" tok/s = tokens of requests finished in the last 10 s


@dataclass
class LiveState:
    """What the view shows, derived from the results so far."""

    phase: str
    elapsed_s: float
    deadline_s: float
    done_prompts: int
    total_prompts: int
    done_output_tokens: int
    total_output_tokens: int
    prefill_tok_s: float
    decode_tok_s: float
    failed: int
    projected_finish_s: float | None
    # p50/p90/p99 of the prompts finished so far (seconds); None before the first
    ttft_p: tuple[float, float, float] | None = None
    tpot_p: tuple[float, float, float] | None = None
    kv_wait_p: tuple[float, float, float] | None = None
    final: bool = False  # the measured run is over: the rates are its averages, not the last 10 s

    @property
    def verdict(self) -> str:
        if self.projected_finish_s is None:
            return "no projection yet"
        slack = self.deadline_s - self.projected_finish_s
        return f"on track ({slack:.0f} s spare)" if slack >= 0 else f"will miss the deadline by {-slack:.0f} s"

    @property
    def rates(self) -> str:
        avg = "run average: " if self.final else ""
        return f"{avg}prefill {self.prefill_tok_s:,.0f} tok/s  decode {self.decode_tok_s:,.0f} tok/s"

    def latency_rows(self) -> list[tuple[str, str | None]]:
        """[("TTFT p50/p90/p99", "a/b/c s"), ...] of the prompts finished so far; None before the first."""
        rows = []
        for name, values, unit, scale, digits in (("TTFT", self.ttft_p, "s", 1.0, 2), ("TPOT", self.tpot_p, "ms", 1e3, 0),
                                                  ("KV wait", self.kv_wait_p, "s", 1.0, 2)):
            text = None if values is None else "/".join(f"{v * scale:.{digits}f}" for v in values) + f" {unit}"
            rows.append((f"{name} p50/p90/p99", text))
        return rows

    def latencies(self) -> str:
        """'TTFT p50/p90/p99 a/b/c s  TPOT ... ms  KV wait ... s' ('' before the first prompt finished)."""
        return "  ".join(f"{name} {text}" for name, text in self.latency_rows() if text is not None)

    def line(self) -> str:
        """One plain log line (quiet mode)."""
        projected = "-" if self.projected_finish_s is None else f"{self.projected_finish_s:.0f}s"
        latencies = self.latencies()
        return (
            f"[{self.elapsed_s:6.1f}s/{self.deadline_s:.0f}s] {self.phase:<12} "
            f"prompts {self.done_prompts}/{self.total_prompts}  "
            f"out-tokens {self.done_output_tokens}/{self.total_output_tokens}  {self.rates}  "
            f"failed {self.failed}  " + (f"{latencies}  " if latencies else "")
            + f"projected {projected} ({self.verdict})"
        )


class LiveView:
    """Progress of one run; call `phase()` on phase changes and `update(result)` per finished prompt."""

    def __init__(
        self,
        deadline_s: float,
        total_prompts: int,
        total_output_tokens: int,
        quiet: bool = False,
        stream: TextIO | None = None,
        log_interval_s: float = 10.0,
        started_at: float | None = None,
        metrics: BenchMetrics | None = None,
        title: str = "pd-orchestrator bench",
        time_scale: float | None = None,
    ):
        self.deadline_s = deadline_s
        self.total_prompts = total_prompts
        self.total_output_tokens = total_output_tokens
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stdout
        self.log_interval_s = log_interval_s
        self.started_at = started_at if started_at is not None else (
            metrics.started_at if metrics is not None else time.time())
        self.metrics = metrics
        # elapsed, deadline and tok/s in the run's unit: simulated seconds when the sim's time_scale != 1
        self.time_scale = time_scale or (metrics.time_scale if metrics is not None else 1.0)
        self.title = title
        self._phase = Phase.PLACEMENT.value
        self._run_started_s: float | None = None
        self._run_ended_s: float | None = None
        self._done = 0
        self._failed = 0
        self._output_tokens = 0
        self._input_tokens = 0
        self._ttft: list[float] = []  # wall seconds, as results arrive
        self._tpot: list[float] = []
        self._kv_wait: list[float] = []
        self._recent: collections.deque[tuple[float, int, int]] = collections.deque()  # (done_at, in, out)
        self._lock = threading.Lock()
        self._last_line_at = float("-inf")
        self._live: Live | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> "LiveView":
        if not self.quiet:
            console = Console(file=self.stream)
            self._live = Live(self, console=console, refresh_per_second=4, transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            if self._run_started_s is None:  # never reached the measured run: no empty frame left behind
                self._live.transient = True
            self._live.stop()
            self._live = None
        else:
            self._log(force=True)

    # -- inputs ------------------------------------------------------------------------------------

    def phase(self, name: str) -> None:
        """The job entered phase `name` (metrics.BENCH_PHASES / EXTRA_PHASES, or the driver's spelling)."""
        name = canonical_phase(name)
        with self._lock:
            if self._phase == Phase.RUN and name != Phase.RUN and self._run_ended_s is None:
                self._run_ended_s = self._elapsed()
            self._phase = name
            if name == Phase.RUN and self._run_started_s is None:
                self._run_started_s = self._elapsed()
        if self.metrics is not None:
            self.metrics.phase(name)
        self._log(force=True)

    def update(self, result: RequestResult) -> None:
        """One prompt finished (ok or failed)."""
        now = time.time()
        with self._lock:
            self._done += 1
            if result.status == "ok":
                self._output_tokens += result.completion_tokens
                self._input_tokens += result.prompt_len
                self._recent.append((result.done_at or now, result.prompt_len, result.completion_tokens))
                for values, value in ((self._ttft, result.ttft_s), (self._tpot, tpot_s(result)),
                                      (self._kv_wait, result.kv_wait_s)):
                    if value is not None:
                        values.append(value)
            else:
                self._failed += 1
        state = self.state()
        if self.metrics is not None:
            self.metrics.progress(state.done_prompts, state.total_prompts, state.done_output_tokens,
                                  state.total_output_tokens, state.projected_finish_s)
        self._log()

    # -- outputs -----------------------------------------------------------------------------------

    def state(self) -> LiveState:
        now = time.time()
        with self._lock:
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
            ended, started = self._run_ended_s, self._run_started_s
            final = ended is not None and started is not None
            if ended is not None and started is not None:  # after the run the last 10 s hold no finished prompt:
                run_s = max(ended - started, 1e-9)  # show the run's averages
                prefill, decode = self._input_tokens / run_s, self._output_tokens / run_s
            else:
                run_wall_s = (self._elapsed() - (self._run_started_s or 0.0)) * self.time_scale
                window = min(RATE_WINDOW_S, max(run_wall_s, 1.0)) / self.time_scale
                prefill = sum(r[1] for r in self._recent) / window
                decode = sum(r[2] for r in self._recent) / window
            elapsed = self._elapsed()

            def pcts(values: list[float]) -> tuple[float, float, float] | None:
                if not values:
                    return None
                p50, p90, p99 = (percentile(values, q) / self.time_scale for q in (50, 90, 99))
                return p50, p90, p99

            return LiveState(
                phase=self._phase, elapsed_s=elapsed, deadline_s=self.deadline_s, done_prompts=self._done,
                total_prompts=self.total_prompts, done_output_tokens=self._output_tokens,
                total_output_tokens=self.total_output_tokens, prefill_tok_s=prefill, decode_tok_s=decode,
                failed=self._failed,
                projected_finish_s=projected_finish(elapsed, self._run_started_s, self._output_tokens,
                                                    self.total_output_tokens),
                ttft_p=pcts(self._ttft), tpot_p=pcts(self._tpot), kv_wait_p=pcts(self._kv_wait), final=final,
            )

    def __rich__(self) -> Group:
        s = self.state()
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        table.add_row("phase", s.phase)
        over = s.elapsed_s > s.deadline_s
        table.add_row("elapsed", Text(f"{s.elapsed_s:.1f} s of {s.deadline_s:.0f} s",
                                      style="red" if over else ""))
        table.add_row("prompts", f"{s.done_prompts}/{s.total_prompts}")
        table.add_row("output tokens", f"{s.done_output_tokens}/{s.total_output_tokens}")
        table.add_row("throughput", s.rates)
        for name, text in s.latency_rows():
            table.add_row(name, text or "-")
        table.add_row("failed", Text(str(s.failed), style="red" if s.failed else "green"))
        projected = "-" if s.projected_finish_s is None else f"{s.projected_finish_s:.0f} s"
        table.add_row("projected finish", Text(f"{projected}  {s.verdict}",
                                               style="red" if "miss" in s.verdict else "green"))
        table.add_row("deadline", ProgressBar(total=s.deadline_s, completed=min(s.elapsed_s, s.deadline_s), width=50))
        table.add_row("prompts done", ProgressBar(total=max(s.total_prompts, 1), completed=s.done_prompts, width=50))
        table.add_row("tokens done", ProgressBar(total=max(s.total_output_tokens, 1),
                                                 completed=s.done_output_tokens, width=50))
        return Group(Text(self.title, style="bold"), table)

    # -- internals ---------------------------------------------------------------------------------

    def _elapsed(self) -> float:
        return (time.time() - self.started_at) / self.time_scale

    def _log(self, force: bool = False) -> None:
        if not self.quiet:
            return
        now = time.monotonic()
        if not force and now - self._last_line_at < self.log_interval_s:
            return
        self._last_line_at = now
        print(self.state().line(), file=self.stream, flush=True)
