#!/usr/bin/env python3
"""A small stand-in for `kustomize build` (kustomize/kubectl are not installable here).

Supports exactly what deploy/kubernetes uses, and fails on any other
kustomization field so that nothing is silently ignored:
  resources   files, or directories holding a kustomization.yaml (recursively)
  namespace   set on every namespaced object, and as the name of a Namespace object
  labels      pairs added to metadata.labels (includeSelectors: false only, and
              includeTemplates to also label pod templates)
  images      name -> newName / newTag / digest, applied to containers and initContainers

Usage: kustomize_build.py DIR   (prints the multi-document YAML stream)
"""

import os
import sys

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "labels", "images"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass",
                  "StorageClass", "PersistentVolume"}


class KustomizeError(Exception):
    pass


def load(path):
    with open(path, encoding="utf-8") as fh:
        return [d for d in yaml.safe_load_all(fh) if d is not None]


def image_parts(image):
    name, digest = (image.split("@", 1) + [None])[:2]
    tag = None
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    return name, tag, digest


def set_images(obj, images):
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec") if "template" in spec else None
    if obj.get("kind") == "Pod":
        pod = spec
    if not pod:
        return
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        name, tag, digest = image_parts(c["image"])
        for im in images:
            if im["name"] != name:
                continue
            new_name = im.get("newName", name)
            if "digest" in im:
                c["image"] = "%s@%s" % (new_name, im["digest"])
            elif "newTag" in im:
                c["image"] = "%s:%s" % (new_name, im["newTag"])
            else:
                c["image"] = new_name + (":" + tag if tag else "") + ("@" + digest if digest else "")


def build(directory):
    kpath = os.path.join(directory, "kustomization.yaml")
    if not os.path.exists(kpath):
        raise KustomizeError("%s has no kustomization.yaml" % directory)
    (k,) = load(kpath)
    extra = set(k) - SUPPORTED
    if extra:
        raise KustomizeError("%s: fields not supported by this stand-in: %s" % (kpath, ", ".join(sorted(extra))))
    objs = []
    for r in k.get("resources", []):
        full = os.path.normpath(os.path.join(directory, r))
        if os.path.isdir(full):
            objs.extend(build(full))
        elif os.path.isfile(full):
            objs.extend(load(full))
        else:
            raise KustomizeError("%s: resource %s does not exist" % (kpath, r))
    ns = k.get("namespace")
    for o in objs:
        md = o.setdefault("metadata", {})
        if ns:
            if o.get("kind") == "Namespace":
                md["name"] = ns
            elif o.get("kind") not in CLUSTER_SCOPED:
                md["namespace"] = ns
        for lab in k.get("labels", []):
            if lab.get("includeSelectors"):
                raise KustomizeError("%s: labels.includeSelectors is not supported" % kpath)
            md.setdefault("labels", {}).update(lab.get("pairs", {}))
            if lab.get("includeTemplates") and "template" in o.get("spec", {}):
                tmd = o["spec"]["template"].setdefault("metadata", {})
                tmd.setdefault("labels", {}).update(lab.get("pairs", {}))
        set_images(o, k.get("images", []))
    seen = set()
    for o in objs:
        key = (o.get("apiVersion"), o.get("kind"), o["metadata"].get("namespace"), o["metadata"].get("name"))
        if key in seen:
            raise KustomizeError("duplicate object %s" % (key,))
        seen.add(key)
    return objs


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        objs = build(sys.argv[1])
    except KustomizeError as exc:
        print("kustomize_build: error: %s" % exc, file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump_all(objs, sort_keys=False, width=120))
    return 0


if __name__ == "__main__":
    sys.exit(main())
