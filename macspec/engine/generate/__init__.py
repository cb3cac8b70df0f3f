"""The guess-and-verify loop (Engine), the answer it wraps (stops, Done) and the distributed engine.
Imports the sub-packages below it."""
