"""``lakehouse serve`` (the HTTP API) and ``lakehouse tokens issue`` (its bearer tokens)."""

from __future__ import annotations

import click

from lakehouse_assets.cli.context import Context, pass_ctx
from lakehouse_assets.cli.root import cli


@cli.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="Port."
)
@click.option(
    "--workers", default=1, show_default=True, type=click.IntRange(1, 64), help="Processes."
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="The lowest level logged (stderr; each line with its request id).",
)
@pass_ctx
def serve_cmd(obj: Context, host: str, port: int, workers: int, log_level: str) -> None:
    """Serve the lake over HTTP (OpenAPI docs at /docs, health at /health).

    Needs LAKEHOUSE_API_SECRET (32+ characters): tenants call it with tokens
    from `lakehouse tokens issue`. Put TLS in front (a reverse proxy).

    \b
    Example:
      lakehouse --lake ./lake serve --port 8000 --workers 2
    """
    from lakehouse_assets.server.serve import serve

    lake = obj.lake  # the lake must exist (and its catalog config is applied)
    serve(lake.settings, host=host, port=port, workers=workers, log_level=log_level)


@cli.group()
def tokens() -> None:
    """Bearer tokens of the HTTP API."""


@tokens.command("issue")
@click.option("--tenant", required=True, help="The tenant the token acts as (its sub).")
@click.option(
    "--dataset",
    "datasets",
    multiple=True,
    required=True,
    help="A dataset name or glob (news_*); repeat for more.",
)
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    required=True,
    type=click.Choice(["read", "write", "operate", "admin"]),
    help="An action the token allows; repeat for more (admin: all).",
)
@click.option("--expires", default="1h", show_default=True, help="Lifetime: 30m, 1h, 7d.")
@pass_ctx
def tokens_issue(
    obj: Context, tenant: str, datasets: tuple[str, ...], scopes: tuple[str, ...], expires: str
) -> None:
    """Print a token signed with LAKEHOUSE_API_SECRET.

    \b
    Example:
      lakehouse tokens issue --tenant aleph --dataset news --scope read --expires 1h
    """
    from lakehouse_assets.tokens import parse_duration, server_secret, sign, token_claims

    try:
        lifetime = parse_duration(expires)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--expires") from None
    limit = obj.settings.api_token_max_hours
    if lifetime.total_seconds() > limit * 3600:
        raise click.BadParameter(
            f"{expires} is longer than LAKEHOUSE_API_TOKEN_MAX_HOURS ({limit:g} h)",
            param_hint="--expires",
        )
    claims = token_claims(
        tenant=tenant, datasets=list(datasets), actions=list(scopes), expires=lifetime
    )
    click.echo(sign(claims, server_secret(obj.settings)))
    click.echo(f"token id (for `lakehouse tokens revoke`): {claims['jti']}", err=True)


@tokens.command("revoke")
@click.argument("token_or_id")
@pass_ctx
def tokens_revoke(obj: Context, token_or_id: str) -> None:
    """Refuse a token from now on (the token, or the id `tokens issue` printed).

    The id goes to the revocation list the server reads (under
    LAKEHOUSE_API_STATE_DIR, so give this command the server's value): 401
    from the next request on. Older tokens, issued without an id, cannot be
    revoked and end at their expiry.

    \b
    Example:
      lakehouse tokens revoke 3f2c9a0d8b7e4f61a2c5d9e0b1f34a7c
    """
    revoke_and_say(obj, token_or_id, "TOKEN_OR_ID")


def revoke_and_say(obj: Context, token_or_id: str, hint: str) -> None:
    """:func:`~lakehouse_assets.tokens.revoke` for a command (tokens' and profiles'):
    the id and the list it went to, or the reason as a bad ``hint`` parameter."""
    from lakehouse_assets.errors import InvalidNameError
    from lakehouse_assets.tokens import revoke

    try:
        jti, listed = revoke(obj.settings, token_or_id)
    except InvalidNameError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None
    click.echo(f"revoked {jti} (listed in {listed})")
