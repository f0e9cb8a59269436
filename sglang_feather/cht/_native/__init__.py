"""The compiled Chunked Hash Tree (C++17, nanobind); built by `pip install -e .` / `make setup`."""
