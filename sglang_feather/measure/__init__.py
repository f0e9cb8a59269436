"""What both benchmark sides (bench, offline) share: the sampling discipline, synthetic queues, pass plans."""
