"""Offline tooling on real SGLang objects (benchmark baselines, simulator baselines), loaded lazily by name."""
