"""The chat screen's widgets: transcript and messages, the prompt, the stats bar, pickers."""
