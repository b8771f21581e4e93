"""/docs (Swagger UI) and /redoc (ReDoc), served with their scripts and styles from this API.

A bank's network often has no internet, so the pages load nothing from a CDN: the assets come from
the `fastapi-offline` package's files, mounted under /docs/assets. No fonts are fetched either.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs/assets"
# The pages may load only from this API: a bundled asset that links elsewhere (ReDoc's footer logo)
# is then blocked by the browser instead of leaking a request out of the bank's network.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)
_SWAGGER_PARAMETERS = {"validatorUrl": None, "tryItOutEnabled": False, "displayOperationId": True}


def asset_dir() -> Path:
    """The folder holding swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js and a favicon."""
    return Path(str(resources.files("fastapi_offline").joinpath("static")))


def _confined(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page


def install_docs(app: FastAPI, openapi_url: str = "/openapi.json") -> None:
    """Add /docs, /docs/oauth2-redirect and /redoc, plus the assets they load, to `app`."""
    app.mount(ASSETS_URL, StaticFiles(directory=asset_dir()), name="docs-assets")
    title = app.title

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return _confined(
            get_swagger_ui_html(
                openapi_url=openapi_url,
                title=f"{title} API",
                swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
                swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
                swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
                oauth2_redirect_url="/docs/oauth2-redirect",
                swagger_ui_parameters=_SWAGGER_PARAMETERS,
            )
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return _confined(
            get_redoc_html(
                openapi_url=openapi_url,
                title=f"{title} API",
                redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
                redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
                with_google_fonts=False,
            )
        )
