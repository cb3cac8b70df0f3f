"""One drafter per module (model, lookup and hybrid, MTP, DFlash, EAGLE-3), behind the Drafter
protocol. A drafter never verifies. Imports `core` and `caches`."""
