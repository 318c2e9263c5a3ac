"""OpenAPI links (drf-spectacular post-processing hook): what a create answers leads to its object's operations.

A collection ``/api/v1/things/`` whose POST answers the new object (with its ``id``) gets a link from that
answer to every operation on ``/api/v1/things/{id}/`` and its actions (``/api/v1/things/{id}/cancel/``…), with
``id`` taken from the answer's body; the object's GET answer links to the same operations. So a client, and
schemathesis' stateful phase, can follow create → read → change → delete without guessing ids.
"""

SUCCESS = ("201", "200", "202")


def _item_operations(paths: dict, collection: str) -> list[tuple[str, str, str]]:
    """(path, method, operationId) of every operation on one object of ``collection`` (one level of ids)."""
    item = f"{collection}{{id}}/"
    found = []
    for path, operations in paths.items():
        if path == item or (path.startswith(item) and path.count("{") == 1):
            for method, operation in operations.items():
                if isinstance(operation, dict) and "operationId" in operation:
                    found.append((path, method, operation["operationId"]))
    return found


def _links(targets, skip: str | None = None) -> dict:
    return {
        operation_id: {
            "operationId": operation_id,
            "parameters": {"id": "$response.body#/id"},
            "description": f"{method.upper()} {path} of the object in this answer",
        }
        for path, method, operation_id in targets
        if operation_id != skip
    }


def add_links(result, generator, request, public):
    paths = result.get("paths", {})
    for collection, operations in list(paths.items()):
        if "{" in collection or "post" not in operations:
            continue
        targets = _item_operations(paths, collection)
        if not targets:
            continue
        created = operations["post"].get("responses", {})
        code = next((code for code in SUCCESS if code in created), None)
        if code is not None:
            created[code].setdefault("links", {}).update(_links(targets))
        read = paths.get(f"{collection}{{id}}/", {}).get("get")
        if read is not None and "200" in read.get("responses", {}):
            read["responses"]["200"].setdefault("links", {}).update(
                _links(targets, skip=read.get("operationId"))
            )
    return result
