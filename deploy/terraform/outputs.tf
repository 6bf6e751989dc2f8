output "service_accounts" {
  description = "Service account email per service: serviceAccountName in deploy/cloudrun, iam.gke.io/gcp-service-account in deploy/k8s."
  value       = { for s, sa in google_service_account.service : s => sa.email }
}

output "migrate_service_account" {
  description = "Service account of the Cloud Run migrate jobs."
  value       = google_service_account.migrate.email
}

output "topics" {
  description = "Events topic and its dead-letter topic (null while nothing subscribes to the topic), per publishing service."
  value = {
    for k, t in google_pubsub_topic.events : k => {
      topic = t.name
      dlq   = try(google_pubsub_topic.dlq[k].name, null)
    }
  }
}

output "subscriptions" {
  description = "Per subscription (by name): the topic it reads, the service that consumes it, its dead-letter topic and its DLQ keeper subscription."
  value = {
    for k, s in google_pubsub_subscription.events : s.name => {
      subscription      = s.name
      topic             = google_pubsub_topic.events[local.subscriptions[k].topic].name
      consumer          = local.subscriptions[k].consumer
      dead_letter_topic = google_pubsub_topic.dlq[local.subscriptions[k].topic].name
      dlq_keeper        = google_pubsub_subscription.dlq_keeper[k].name
    }
  }
}

output "database_secrets" {
  description = "Secret Manager secrets to fill: the serving URL (service account) and the admin URL (migrate job)."
  value = {
    for s in keys(google_secret_manager_secret.database_url) : s => {
      url       = google_secret_manager_secret.database_url[s].secret_id
      admin_url = google_secret_manager_secret.database_admin_url[s].secret_id
    }
  }
}

output "image_repository" {
  description = "Where to push deploy/Dockerfile's image."
  value       = "${var.region}-docker.pkg.dev/${var.project_id}/${google_artifact_registry_repository.courier.repository_id}/courier"
}
