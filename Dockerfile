# The example API server (orchestrator/demo/api_server.py, the api extra) with the
# orchestrator embedded.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never

RUN pip install --no-cache-dir uv

WORKDIR /app
# Dependencies first, so a code change does not reinstall them.
COPY pyproject.toml uv.lock README.md LICENSE ./
RUN uv sync --frozen --no-dev --extra api --no-install-project

COPY orchestrator ./orchestrator
RUN uv sync --frozen --no-dev --extra api

ENV PATH="/app/.venv/bin:$PATH"
RUN useradd --system --uid 10001 app
USER app

EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]

# MONGODB_URI comes from the environment (docker-compose.yml sets it).
CMD ["uvicorn", "orchestrator.demo.api_server:app", "--host", "0.0.0.0", "--port", "8000"]
