"""Shared test machinery: role fixtures, real processes (uvicorn, Celery, Redis) and API helpers."""
