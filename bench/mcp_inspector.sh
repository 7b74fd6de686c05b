#!/usr/bin/env bash
# Drive `np-tools memory-mcp` with a third-party MCP client: the MCP Inspector's `mcpdo` CLI (npm,
# @modelcontextprotocol/inspector). Needs node/npm and the package registry; installs the inspector
# into a scratch folder (or uses INSPECTOR_DIR), makes a scratch project with the example memories,
# then lists the tools and calls them the way an agent would, including the mistakes agents make.
# Usage: bench/mcp_inspector.sh [inspector-version]   (default 2.12.0). Prints what the client saw.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
bin/setup >/dev/null 2>&1
version=${1:-2.12.0}
work=$(mktemp -d)
trap 'cd /; [ -n "${mcpdo:-}" ] && "$mcpdo" disconnect --connection memory >/dev/null 2>&1; rm -rf "$work"' EXIT
dir=${INSPECTOR_DIR:-$work/inspector}
if [ ! -x "$dir/node_modules/.bin/mcpdo" ]; then
  mkdir -p "$dir"
  (cd "$dir" && npm install --silent --no-audit --no-fund "@modelcontextprotocol/inspector@$version" >/dev/null)
fi
mcpdo=$dir/node_modules/.bin/mcpdo
export MCP_CATALOG_PATH=$work/catalog.json MCP_INSPECTOR_SECRET_STORE=memory
project=$work/project
mkdir -p "$project" && git -C "$project" init -q
"$repo/bin/np-tools" memory-init --root "$project" >/dev/null
"$repo/bin/np-tools" memory-index --root "$project" --records-file "$repo/examples/agent-memories.jsonl" >/dev/null
show() { echo; echo "\$ mcpdo $*"; { "$mcpdo" --plain --format json --connection memory "$@" 2>&1 || true; } | head -c "${LIMIT:-1500}"; echo; }
"$mcpdo" connect --connection memory --cwd "$project" -- "$repo/bin/np-tools" memory-mcp --root "$project" >/dev/null
echo "client: MCP Inspector mcpdo $("$mcpdo" --version)"
LIMIT=600 show connections/show
LIMIT=2500 show tools/list
show tools/call memory_query text:="how do I ship a build?" k:=2
show tools/call memory_query text:="jwt" limit:=5
show tools/call memory_query text:="x" k:=0
show tools/call memory_add type:=learning title:="   "
show tools/call memory_add type:=learning title:="Inspector smoke test" body:="written through mcpdo"
show tools/call memory_get '{"ids": ["no-such-id"]}'
LIMIT=800 show tools/call memory_query text:="how do I ship a build?" format:=markdown k:=1
