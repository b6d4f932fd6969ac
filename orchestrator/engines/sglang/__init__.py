"""Real SGLang engine: launch argv and environment, the dist-store wrapper, readiness."""
