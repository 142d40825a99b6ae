"""Values of secret-looking names (API keys, tokens, passwords) are never echoed: plan.json, error messages."""
from __future__ import annotations

import re

# Names whose values are never echoed (plan.json, error messages): API keys, tokens, passwords.
_SECRET = re.compile(r"token|secret|passw|credential|(?:^|[_-])(?:api_?)?key$", re.I)
_ASSIGNMENT = re.compile(r"(?P<q>['\"])(?P<n>-{0,2}[A-Za-z_][\w.-]*)=[^'\"]*(?P=q)"
                         r"|(?<![^\s'\"=])(?P<m>-{0,2}[A-Za-z_][\w.-]*)=(?:'[^']*'|\"[^\"]*\"|[^\s'\"])*")


def secret_name(name: str) -> bool:
    return bool(_SECRET.search(name.lstrip("-")))


def redact(text: str) -> str:
    """`NAME=value` -> `NAME=***` wherever NAME looks like a secret (HF_TOKEN, WANDB_API_KEY, --password...)."""
    def hide(m):
        name = m["n"] or m["m"]
        if not secret_name(name):
            return m[0]
        return f"{m['q']}{name}=***{m['q']}" if m["q"] else f"{name}=***"
    return _ASSIGNMENT.sub(hide, text)


def redacted(params: dict) -> dict:
    """Sbatch parameters as shown in plan.json: values of secret-looking names (HF_TOKEN=...) hidden; the job
    itself still gets them."""
    out = {}
    for key, value in params.items():
        if isinstance(value, dict):
            value = redacted(value)
        elif isinstance(value, list):
            value = [redact(v) if isinstance(v, str) else v for v in value]
        elif secret_name(str(key)):
            value = "***"
        out[key] = value
    return out
