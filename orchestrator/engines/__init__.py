"""Engine backends: how a worker process is launched (sim or real SGLang)."""
