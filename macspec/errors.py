"""Errors a user can cause: the CLI prints them as one line and exits with code 2."""


class MacspecError(Exception):
    """A problem with the user's input or environment, stated in one line.

    Anything else that escapes is a bug and keeps its traceback.
    """
