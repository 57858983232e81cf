"""Where evidence lives: an S3 bucket (prefect-aws ``S3Bucket``, endpoint configurable) or a folder."""

from __future__ import annotations

from prefect.blocks.core import Block
from prefect_aws.s3 import S3Bucket
from pydantic import Field

__all__ = ["DenpexEvidenceStore"]


class DenpexEvidenceStore(Block):
    """The evidence store the ingest service writes and the flows read."""

    _block_type_slug = "denpex-evidence-store"
    _block_type_name = "Denpex Evidence Store"
    _description = "Where incident evidence lives: an S3 bucket (prefect-aws) or a local folder."

    folder: str | None = Field(default=None, description="An absolute folder, when not S3.")
    s3: S3Bucket | None = Field(default=None, description="An S3 bucket (moto, MinIO or AWS).")

    def uri(self) -> str:
        """``s3://bucket/folder`` or the folder."""
        if self.s3 is not None:
            prefix = (self.s3.bucket_folder or "").strip("/")
            return f"s3://{self.s3.bucket_name}/{prefix}" if prefix else f"s3://{self.s3.bucket_name}"
        if self.folder:
            return self.folder
        raise ValueError("the evidence store block names neither a folder nor an S3 bucket")

    def endpoint_url(self) -> str | None:
        """The S3 endpoint (moto/MinIO), or None for AWS itself or a folder."""
        if self.s3 is None:
            return None
        return self.s3.credentials.aws_client_parameters.endpoint_url
