"""A federated run and its files, driven by either driver: the simulator (`dpfl.engine`) or the
Flower deployment (`dpfl.flower`). `state.Run` holds everything a round changes; `checkpoint` saves
and loads it as plain data; `final_model` rebuilds a finished run's model."""
