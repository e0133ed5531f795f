"""The HTTP API as an OpenAPI 3 document: what GET /spec serves (LibreTranslate serves its own there, and
clients such as Dialect read `info.title` from it before they add a server).

Built from the values the server runs with, never typed twice: texts per request (max_texts), characters
per text (the text layer's MAX_TEXT_CHARS), body bytes (--max-message-bytes), file kinds
(server.files.SUFFIXES), alternatives (the model's beam), /detect's list length (server.detect.RANKED)
and whether a key is required. tests/test_openapi.py validates it with openapi-spec-validator and checks
it against the running server's answers.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any

TITLE = "translator: LibreTranslate-compatible translation API"


@dataclass(frozen=True)
class SpecValues:
    """What the document states about this server."""

    version: str
    max_texts: int
    max_text_chars: int
    max_body_bytes: int
    file_suffixes: tuple[str, ...]
    max_alternatives: int
    detect_ranked: int
    frontend_timeout_ms: int
    key_required: bool


def package_version() -> str:
    """The installed project's version (pyproject.toml), "0" when run from a tree never installed."""
    try:
        return importlib.metadata.version("translator")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): {"$ref": f"#/components/responses/E{s}"} for s in statuses}


ERRORS = {
    400: "Invalid input: a missing or bad parameter, an unserved language pair, a limit passed",
    403: "Missing or wrong api_key (when the server has one)",
    408: "The body did not arrive in time",
    413: "The body is larger than the server takes",
    429: "The server is overloaded: retry after Retry-After seconds",
    500: "The engine failed",
    503: "No model is ready (loading or shutting down)",
    504: "timeout_ms passed",
}


def _body(schema: str, *, files: bool = False) -> dict[str, Any]:
    """A request body as LibreTranslate takes it: JSON or a form (a file upload: multipart only)."""
    kinds = ["multipart/form-data"] if files else ["application/json", "application/x-www-form-urlencoded"]
    if not files:
        kinds.append("multipart/form-data")
    return {"required": True, "content": {k: {"schema": _ref(schema)} for k in kinds}}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _schemas(v: SpecValues) -> dict[str, Any]:
    text = {"type": "string", "maxLength": v.max_text_chars}
    q = {
        "description": f"A text, or a list of up to {v.max_texts} texts (the answer is then a list)",
        "oneOf": [text, {"type": "array", "items": text, "minItems": 1, "maxItems": v.max_texts}],
        "example": "Open the file",
    }
    api_key = {
        "type": "string",
        "description": "The server's token, when it has one (or Authorization: Bearer)",
    }
    detection = {
        "type": "object",
        "required": ["confidence", "language"],
        "properties": {
            "confidence": {"type": "number", "minimum": 0, "maximum": 100, "example": 97.5},
            "language": {"type": "string", "example": "en"},
        },
    }
    note = {
        "type": "object",
        "description": "Extension: what the text layer did to a segment of the source (code points)",
        "properties": {
            "action": {"type": "string", "enum": ["memory", "repaired", "passed_through"]},
            "start": {"type": "integer"},
            "end": {"type": "integer"},
            "reason": {"type": "string"},
        },
    }
    one_or_list = lambda item: {"oneOf": [item, {"type": "array", "items": item}]}  # noqa: E731
    return {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
        "TranslateRequest": {
            "type": "object",
            "required": ["q", "source", "target"],
            "properties": {
                "q": q,
                "source": {"type": "string", "example": "en", "description": "A served source, or auto"},
                "target": {"type": "string", "example": "es"},
                "format": {"type": "string", "enum": ["text", "html"], "default": "text"},
                "alternatives": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": v.max_alternatives,
                    "default": 0,
                },
                "api_key": api_key,
                "timeout_ms": {"type": "integer", "minimum": 0, "description": "Extension: a deadline"},
            },
        },
        "TranslateResponse": {
            "type": "object",
            "required": ["translatedText"],
            "properties": {
                "translatedText": one_or_list({"type": "string"}),
                "alternatives": one_or_list({"type": "array", "items": {"type": "string"}}),
                "detectedLanguage": one_or_list(detection),
                "notes": one_or_list({"type": "array", "items": note}),
            },
        },
        "DetectRequest": {
            "type": "object",
            "required": ["q"],
            "properties": {"q": q, "api_key": api_key},
        },
        "Detection": detection,
        "Detections": {
            "description": f"The {v.detect_ranked} likeliest languages, best first (per text for a list q)",
            "oneOf": [
                {"type": "array", "items": _ref("Detection")},
                {"type": "array", "items": {"type": "array", "items": _ref("Detection")}},
            ],
        },
        "FileRequest": {
            "type": "object",
            "required": ["file", "source", "target"],
            "properties": {
                "file": {
                    "type": "string",
                    "format": "binary",
                    "description": "One of " + ", ".join(v.file_suffixes),
                },
                "source": {"type": "string", "example": "en"},
                "target": {"type": "string", "example": "es"},
                "api_key": api_key,
            },
        },
        "FileResponse": {
            "type": "object",
            "required": ["translatedFileUrl"],
            "properties": {
                "translatedFileUrl": {"type": "string"},
                "filled": {"type": "integer"},
                "leftOut": {"type": "array", "items": {"type": "string"}},
                "detectedLanguage": detection,
            },
        },
        "Language": {
            "type": "object",
            "required": ["code", "name", "targets"],
            "properties": {
                "code": {"type": "string"},
                "name": {"type": "string"},
                "targets": {"type": "array", "items": {"type": "string"}},
            },
        },
        "FrontendSettings": {
            "type": "object",
            "properties": {
                "apiKeys": {"type": "boolean"},
                "keyRequired": {"type": "boolean", "example": v.key_required},
                "charLimit": {"type": "integer", "example": v.max_text_chars},
                "filesTranslation": {"type": "boolean"},
                "supportedFilesFormat": {"type": "array", "items": {"type": "string"}},
                "maxAlternatives": {"type": "integer", "example": v.max_alternatives},
                "frontendTimeout": {"type": "integer", "example": v.frontend_timeout_ms},
                "suggestions": {"type": "boolean", "example": False},
                "language": {"type": "object"},
            },
        },
        "Health": {
            "type": "object",
            "properties": {"status": {"type": "string", "enum": ["SERVING", "NOT_SERVING"]}},
        },
    }


def _op(summary: str, operation_id: str, responses: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"summary": summary, "operationId": operation_id, "responses": responses, **extra}


def build_spec(v: SpecValues) -> dict[str, Any]:
    """The OpenAPI 3.0 document of the HTTP API with these values."""
    keyed = {"security": [{"bearer": []}, {"apiKeyQuery": []}]} if v.key_required else {}
    all_errors = _errors(400, 403, 408, 413, 429, 500, 503, 504)
    files = ", ".join(v.file_suffixes)
    binary = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    path_params = [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in ("id", "name")
    ]
    paths = {
        "/translate": {
            "post": _op(
                "Translate a text or a list of texts",
                "translate",
                {"200": _json("The translations", _ref("TranslateResponse"))} | all_errors,
                requestBody=_body("TranslateRequest"),
                **keyed,
            )
        },
        "/detect": {
            "post": _op(
                "Detect the language of a text or a list of texts",
                "detect",
                {"200": _json("The likeliest languages", _ref("Detections"))} | _errors(400, 403, 408, 413),
                requestBody=_body("DetectRequest"),
                **keyed,
            )
        },
        "/translate_file": {
            "post": _op(
                f"Translate a file ({files})",
                "translateFile",
                {"200": _json("Where to download the translated file", _ref("FileResponse"))} | all_errors,
                requestBody=_body("FileRequest", files=True),
                **keyed,
            )
        },
        "/download_file/{id}/{name}": {
            "get": _op(
                "Download a translated file (kept for a limited time)",
                "downloadFile",
                {"200": {"description": "The file", "content": binary}} | _errors(404),
                parameters=path_params,
            )
        },
        "/languages": {
            "get": _op(
                "The languages served, each with its targets",
                "languages",
                {"200": _json("Languages", {"type": "array", "items": _ref("Language")})},
            )
        },
        "/frontend/settings": {
            "get": _op(
                "Settings LibreTranslate front ends read",
                "frontendSettings",
                {"200": _json("Settings", _ref("FrontendSettings"))},
            )
        },
        "/suggest": {
            "post": _op(
                "Suggest a translation (always disabled here, as LibreTranslate's answer says)",
                "suggest",
                _errors(403),
            )
        },
        "/health": {
            "get": _op(
                "Whether a model is serving",
                "health",
                {
                    "200": _json("Serving", _ref("Health")),
                    "503": _json("Loading or draining", _ref("Health")),
                },
            )
        },
        "/spec": {
            "get": _op("This document", "spec", {"200": _json("OpenAPI 3 document", {"type": "object"})})
        },
        "/": {
            "get": _op(
                "The web page",
                "page",
                {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}},
            )
        },
    }
    responses = {f"E{s}": _json(text, _ref("Error")) for s, text in ERRORS.items()}
    responses["E404"] = _json("No such route or file", _ref("Error"))
    responses["E403"] = _json(ERRORS[403] + "; on /suggest: suggestions are disabled", _ref("Error"))
    return {
        "openapi": "3.0.3",
        "info": {
            "title": TITLE,
            "version": v.version,
            "description": (
                "LibreTranslate's REST API, served beside the gRPC API by the same process. Bodies are JSON "
                f"or forms, at most {v.max_body_bytes} bytes; at most {v.max_texts} texts per request and "
                f'{v.max_text_chars} characters per text. Errors are {{"error": message}}.'
            ),
        },
        "paths": paths,
        "components": {
            "schemas": _schemas(v),
            "responses": responses,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKeyQuery": {"type": "apiKey", "in": "query", "name": "api_key"},
            },
        },
    }
