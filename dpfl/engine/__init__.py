"""The simulator: the driver of a run whose clients train in this process (`simulator.simulate`)."""
