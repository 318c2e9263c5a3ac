# Lockstep control plane image: web (uvicorn), worker and beat (celery) all run from it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --system --create-home --home-dir /home/lockstep --uid 10001 lockstep
WORKDIR /app

# Dependencies first, from pyproject.toml alone, so code changes reuse this layer.
# pyproject.toml declares no packages (the apps run from /app), so this installs just the dependencies.
COPY pyproject.toml ./
RUN pip install . && rm -rf build *.egg-info

COPY . .
RUN SECRET_KEY=collectstatic-only-this-is-not-a-secret-key DATABASE_URL=sqlite://:memory: python manage.py collectstatic --noinput \
    && mkdir -p var \
    && chown -R lockstep:lockstep var

USER lockstep
EXPOSE 8000
# uvicorn believes X-Forwarded-For only from FORWARDED_ALLOW_IPS: none unless set (its own default is 127.0.0.1).
ENV FORWARDED_ALLOW_IPS=""
CMD ["uvicorn", "controlplane.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
