#!/bin/sh
# One-shot MinIO setup for docker-compose.yml (runs in the minio/mc image): creates the bucket and
# a non-root identity for orl (ORL_S3_ACCESS_KEY / ORL_S3_SECRET_KEY) with read/write access, so
# the orl containers never hold MinIO's root credentials. Safe to run again.
set -eu
mc alias set local http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD"
mc mb --ignore-existing "local/$S3_BUCKET"
if [ "$ORL_S3_ACCESS_KEY" != "$MINIO_ROOT_USER" ]; then
  mc admin user add local "$ORL_S3_ACCESS_KEY" "$ORL_S3_SECRET_KEY"
  if ! mc admin user info local "$ORL_S3_ACCESS_KEY" | grep -q readwrite; then
    mc admin policy attach local readwrite --user "$ORL_S3_ACCESS_KEY"
  fi
fi
echo "bucket $S3_BUCKET ready for $ORL_S3_ACCESS_KEY"
