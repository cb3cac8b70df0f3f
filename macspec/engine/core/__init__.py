"""What every room of the engine speaks: sampling, verdicts, stops, cycle records, stats, events,
configuration, wired memory and taps (what a drafter needs from the verify pass). Imports no other
sub-package."""
