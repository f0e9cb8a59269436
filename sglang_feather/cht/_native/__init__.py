"""The compiled Chunked Hash Tree core (C++17, nanobind); built by `pip install -e .` / `make setup`."""
