"""The branch-office HTTP API: FastAPI app, API keys, authentication and error bodies.

`producer.api.app:create_app` is the app factory uvicorn runs (`tidegate api`).
"""
