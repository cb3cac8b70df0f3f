"""The OpenAI-compatible server: HTTP routes, a queue to the one engine, prompt-cache reuse."""

from macspec._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "APIError": "errors",
        "Backend": "backend",
        "Defaults": "backend",
        "make_app": "app",
        "PromptCache": "prompt_cache",
        "ServerThread": "server",
        "check_host": "server",
        "run_server": "server",
        "Worker": "worker",
    },
)
