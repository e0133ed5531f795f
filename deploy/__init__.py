"""Deployment files (Dockerfile helpers, compose, Prometheus, Grafana, nginx, Kubernetes) and the
Python helpers that tests and deploy/render_dashboard.py share; see docs/deploy.md."""
