"""SGLang's scheduler of one server, without a clock: admission and KV (admission.py), the step loop (steps.py)."""
