"""A model with its caches: rollback for every cache type, checkpoints, recurrent pass records, tree
attention, the batch rows' caches and prefix blocks. Imports only `core`."""
