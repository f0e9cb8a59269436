"""Real SGLang 0.5.23 objects on CPU without a server, for the tooling above it (sim, bench), which imports it lazily."""
