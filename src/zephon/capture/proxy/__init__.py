"""HTTP capture proxy in front of an OpenAI-compatible engine (vLLM, SGLang).

``zephon capture serve --inference-server URL --store STORE_URL`` or, from Python::

    from zephon.capture.proxy import ProxyConfig, create_app, serve

    serve(ProxyConfig(engine_url="http://127.0.0.1:8000", store_url="file:///var/capture"),
          port=8100, workers=2)

The server stack (Starlette, uvicorn, httpx: the ``serve`` extra) is imported only when
``create_app`` or ``serve`` is used. See ``docs/capture-proxy.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zephon.capture.proxy._config import CONFIG_ENV, ProxyConfig

if TYPE_CHECKING:
    from zephon.capture.proxy.app import create_app
    from zephon.capture.proxy.server import serve

__all__ = ["CONFIG_ENV", "ProxyConfig", "create_app", "serve"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from zephon.capture.proxy.app import create_app

        return create_app
    if name == "serve":
        from zephon.capture.proxy.server import serve

        return serve
    raise AttributeError(f"module 'zephon.capture.proxy' has no attribute {name!r}")
