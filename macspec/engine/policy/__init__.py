"""How much to guess and with which drafter, priced on measured costs. Imports the sub-packages
below it (core, caches, drafters)."""
