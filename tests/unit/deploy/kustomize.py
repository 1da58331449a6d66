"""A small kustomize renderer for the features deploy/k8s uses, so the tests render every overlay offline.

Supported kustomization keys: ``resources`` (files and directories holding a kustomization), ``namespace``,
``images`` (``newName``/``newTag``/``digest``), ``labels`` (``pairs``, ``includeTemplates``,
``includeSelectors``), ``patches`` (``path`` or inline ``patch``; a strategic-merge patch, including
``$patch: delete``, or a JSON 6902 list of operations; ``target`` by kind/name/labelSelector). Anything else
is an error, so a manifest that starts using a new feature fails here instead of rendering wrongly.
Where ``kubectl`` or ``kustomize`` is installed the tests compare this renderer's output with theirs.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "images", "labels", "patches"}
# Strategic merge: list fields merged by a key instead of replaced (the subset of the Kubernetes schema's
# x-kubernetes-patch-merge-key that these manifests use).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "volumeClaimTemplates": "metadata.name",
}
# Kinds without a namespace.
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}


class KustomizeError(ValueError):
    pass


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize directory`` would print, in order."""
    directory = Path(directory)
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(f"{directory} has no kustomization.yaml")
    k = yaml.safe_load(path.read_text()) or {}
    unknown = set(k) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{path}: unsupported keys {sorted(unknown)}")
    objects: list[dict[str, Any]] = []
    for res in k.get("resources", []):
        target = (directory / res).resolve()
        if target.is_dir():
            objects += render(target)
        elif target.is_file():
            if not target.is_relative_to(directory.resolve()):
                raise KustomizeError(f"{path}: {res} is outside the kustomization (kustomize refuses it)")
            objects += [d for d in yaml.safe_load_all(target.read_text()) if d]
        else:
            raise KustomizeError(f"{path}: resource {res} does not exist")
    for patch in k.get("patches", []):
        objects = _apply_patch(directory, patch, objects)
    for spec in k.get("labels", []):
        for obj in objects:
            _label(obj, spec)
    if "namespace" in k:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = k["namespace"]
    for image in k.get("images", []):
        for obj in objects:
            _set_image(obj, image)
    _no_duplicates(objects, path)
    return objects


def _no_duplicates(objects: list[dict[str, Any]], where: Path) -> None:
    seen = set()
    for obj in objects:
        ident = (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if ident in seen:
            raise KustomizeError(f"{where}: duplicate {ident}")
        seen.add(ident)


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    if obj["kind"] == "Pod":
        return [spec]
    if obj["kind"] == "CronJob":
        return [spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec", {})]
    template = spec.get("template", {}).get("spec")
    return [template] if template else []


def _set_image(obj: dict[str, Any], image: dict[str, str]) -> None:
    for pod in _pod_specs(obj):
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            name = c["image"].split("@")[0]
            name = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
            if name != image["name"]:
                continue
            new = image.get("newName", name)
            if "digest" in image:
                c["image"] = f"{new}@{image['digest']}"
            elif "newTag" in image:
                c["image"] = f"{new}:{image['newTag']}"
            else:
                c["image"] = new + c["image"][len(name) :]


def _label(obj: dict[str, Any], spec: dict[str, Any]) -> None:
    """``labels`` entry: metadata always, pod templates with includeTemplates, selectors with includeSelectors."""
    pairs = spec["pairs"]
    obj.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
    template = obj.get("spec", {}).get("template")
    if isinstance(template, dict) and (spec.get("includeTemplates") or spec.get("includeSelectors")):
        template.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
        for claim in obj["spec"].get("volumeClaimTemplates", []):  # kustomize labels these templates too
            claim.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
    if spec.get("includeSelectors"):
        sel = obj.get("spec", {}).get("selector")
        if obj["kind"] == "Service":
            obj["spec"].setdefault("selector", {}).update(pairs)
        elif isinstance(sel, dict):
            sel.setdefault("matchLabels", {}).update(pairs)


def _matches(obj: dict[str, Any], target: dict[str, Any]) -> bool:
    if "kind" in target and obj["kind"] != target["kind"]:
        return False
    if "name" in target and obj["metadata"]["name"] != target["name"]:
        return False
    if "labelSelector" in target:
        labels = obj["metadata"].get("labels", {})
        for term in target["labelSelector"].split(","):
            key, _, value = term.partition("=")
            if labels.get(key.strip()) != value.strip():
                return False
    return True


def _apply_patch(directory: Path, patch: dict[str, Any], objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    text = (directory / patch["path"]).read_text() if "path" in patch else patch["patch"]
    body = yaml.safe_load(text)
    target = patch.get("target")
    if isinstance(body, list):  # JSON 6902
        if not target:
            raise KustomizeError("a JSON 6902 patch needs a target")
        hits = [o for o in objects if _matches(o, target)]
        if not hits:
            raise KustomizeError(f"patch target {target} matches nothing")
        for obj in hits:
            for op in body:
                _json_patch(obj, op)
        return objects
    # Strategic merge: the patch names its object unless a target is given.
    target = target or {"kind": body["kind"], "name": body["metadata"]["name"]}
    hits = [o for o in objects if _matches(o, target)]
    if not hits:
        raise KustomizeError(f"patch target {target} matches nothing")
    if body.get("$patch") == "delete":
        return [o for o in objects if not any(o is h for h in hits)]
    for obj in hits:
        merged = _merge(obj, {k: v for k, v in body.items() if k not in ("apiVersion", "kind")})
        obj.clear()
        obj.update(merged)
    return objects


def _merge(base: Any, patch: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = _merge(out[key], value, key)
            else:
                out[key] = copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        out = copy.deepcopy(base)
        for item in patch:
            ident = _dig(item, key)
            index = next((i for i, b in enumerate(out) if _dig(b, key) == ident), None)
            if item.get("$patch") == "delete":
                if index is not None:
                    out.pop(index)
            elif index is None:
                out.append(copy.deepcopy(item))
            else:
                out[index] = _merge(out[index], item)
        return out
    return copy.deepcopy(patch)


def _dig(item: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        item = item.get(part, {}) if isinstance(item, dict) else {}
    return item


def _json_patch(obj: dict[str, Any], op: dict[str, Any]) -> None:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
    parent: Any = obj
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    last = parts[-1]
    kind = op["op"]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if kind == "add":
            parent.insert(index, copy.deepcopy(op["value"]))
        elif kind == "replace":
            parent[index] = copy.deepcopy(op["value"])
        elif kind == "remove":
            parent.pop(index)
        else:
            raise KustomizeError(f"unsupported JSON patch op {kind}")
        return
    if kind in ("add", "replace"):
        if kind == "replace" and last not in parent:
            raise KustomizeError(f"replace of missing {op['path']}")
        parent[last] = copy.deepcopy(op["value"])
    elif kind == "remove":
        del parent[last]
    else:
        raise KustomizeError(f"unsupported JSON patch op {kind}")
