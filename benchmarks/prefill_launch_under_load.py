"""The back-test if the step loop also charged, under load, the part of a prefill's CPU launch that the previous
forward's GPU time does not hide (SGLang's overlap loop: the launch of forward k starts when forward k-1's launch
ended or forward k-2 ended, whichever is later). Not the model: what docs/fidelity.md quotes against it.

    .venv/bin/python benchmarks/prefill_launch_under_load.py > benchmarks/results/2026-11-26-answer-latency/backtest-launch-charged-under-load.txt
"""

from orchestrator.cli import main
from orchestrator.perfmodel.scheduling import steps

_schedule = steps.StepScheduler.schedule


def schedule(self):
    ahead = getattr(self, "_ahead", 0.0)
    was_idle = self._idle
    step = _schedule(self)
    f = step.forward
    if f is None or self.cost.pp > 1:  # PP's loop does not overlap: the model already charges every stage launch
        self._ahead = 0.0
        return step
    if f.kind == "prefill":
        launch = self.cost.prefill_launch_s(len(f.prefill))
        gpu = self.cost.prefill_time_s([t for _, t in f.prefill], [s.prefilled for s, _ in f.prefill])
        left = launch - (0.0 if was_idle or not self.overlap_launch else ahead)
        f.duration_s = max(f.duration_s if not was_idle else gpu, left)
        self._ahead = f.duration_s - max(0.0, left) if self.overlap_launch else 0.0
    else:
        eager = self.cost.decode_runs_eager(len(f.running))
        launch = min(f.duration_s, self.cost.eager_launch_s(len(f.running))) if eager else 0.0
        self._ahead = f.duration_s - launch if self.overlap_launch else 0.0
    return step


steps.StepScheduler.schedule = schedule  # type: ignore[method-assign]
raise SystemExit(main(["plan", "--backtest"]))
