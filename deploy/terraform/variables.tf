variable "project_id" {
  description = "Google Cloud project that holds the topics, subscriptions and service accounts."
  type        = string
}

variable "region" {
  description = "Region of the Artifact Registry repository and the Cloud Run services."
  type        = string
  default     = "europe-west1"
}

variable "message_retention_duration" {
  description = "How long subscriptions keep messages, acked ones included, so that an offset reset can Seek back (P4). Also the DLQ keepers' retention."
  type        = string
  default     = "604800s" # 7 days, the maximum
}

variable "gke_workload_identity" {
  description = "Let the Kubernetes service accounts courier/catalog, courier/engagement and courier/search act as the Google service accounts (deploy/k8s on GKE with Workload Identity)."
  type        = bool
  default     = false
}

variable "k8s_namespace" {
  description = "Namespace of deploy/k8s (Workload Identity bindings)."
  type        = string
  default     = "courier"
}

variable "cloud_run_invokers" {
  description = <<-EOT
    Who may call each Cloud Run service, e.g.
      { catalog = ["serviceAccount:frontend@my-project.iam.gserviceaccount.com"] }
    The services must already exist (gcloud run services replace), so this stays empty on the
    first apply.
  EOT
  type        = map(list(string))
  default     = {}
}

variable "operators" {
  description = "Members (e.g. group:oncall@example.com) who run the courier CLI against the DLQs: inspect the keeper subscriptions and republish to the source topics."
  type        = list(string)
  default     = []
}
