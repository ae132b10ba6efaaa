"""``lakehouse sharing profile|revoke``: Delta Sharing recipients' profile files."""

from __future__ import annotations

import json
from pathlib import Path

import click

from lakehouse_assets.cli.context import Context, pass_ctx
from lakehouse_assets.cli.root import cli


@cli.group()
def sharing() -> None:
    """Delta Sharing: profiles for recipients of the lake's tables."""


@sharing.command("profile")
@click.option("--tenant", required=True, help="Who the recipient is (the token's sub).")
@click.option(
    "--dataset",
    "datasets",
    multiple=True,
    required=True,
    help="A dataset (schema) to share, or a glob (news_*); repeat for more.",
)
@click.option("--expires", default="30d", show_default=True, help="Lifetime: 12h, 30d.")
@click.option(
    "--endpoint",
    default=None,
    help="The server's URL as the recipient reaches it [LAKEHOUSE_PUBLIC_URL, "
    "else http://127.0.0.1:8000]; /delta-sharing is appended.",
)
@pass_ctx
def profile_cmd(
    obj: Context, tenant: str, datasets: tuple[str, ...], expires: str, endpoint: str | None
) -> None:
    """Print a profile file (shareCredentialsVersion 1) for `lakehouse serve`.

    Its token reads the named datasets' tables through /delta-sharing only
    (the tenant API refuses it) until it expires or is revoked.

    \b
    Example:
      lakehouse sharing profile --tenant analysts --dataset news --expires 30d > news.share
    """
    from lakehouse_assets.sharing import PREFIX, issue, profile
    from lakehouse_assets.tokens import parse_duration, server_secret

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
    base = endpoint or obj.settings.public_url or "http://127.0.0.1:8000"
    token, claims = issue(
        server_secret(obj.settings), tenant=tenant, datasets=list(datasets), expires=lifetime
    )
    click.echo(json.dumps(profile(base.rstrip("/") + PREFIX, token, claims["exp"]), indent=2))
    click.echo(f"profile id (for `lakehouse sharing revoke`): {claims['jti']}", err=True)


@sharing.command("revoke")
@click.argument("profile_or_id")
@pass_ctx
def revoke_cmd(obj: Context, profile_or_id: str) -> None:
    """Refuse a profile from now on (a profile file, or its id).

    Written to the server's state folder (LAKEHOUSE_API_STATE_DIR: run this
    with the server's setting); every worker sees it on its next request, and
    the file URLs already handed out for it stop working too.

    \b
    Example:
      lakehouse sharing revoke news.share
    """
    from lakehouse_assets.cli.server import revoke_and_say

    path = Path(profile_or_id)
    given = json.loads(path.read_text())["bearerToken"] if path.is_file() else profile_or_id
    revoke_and_say(obj, given, "PROFILE_OR_ID")
