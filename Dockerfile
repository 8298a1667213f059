FROM python:3.11-slim
WORKDIR /app
COPY requirements.txt pyproject.toml ./
COPY durable ./durable
COPY durable_admin ./durable_admin
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
ENV DJANGO_SETTINGS_MODULE=project.settings PYTHONUNBUFFERED=1
