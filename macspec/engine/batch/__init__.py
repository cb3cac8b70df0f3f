"""Several requests decoded together: the batch engine, its rows, the batch draft model and
batch pricing. The top of the engine."""
