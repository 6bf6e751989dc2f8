# Courier on Google Cloud: Pub/Sub topics and subscriptions with their dead-letter topics,
# one service account per service with only the roles its seed needs, Secret Manager secrets
# for the database URLs, and the image repository.
#
# Messages flow:
#   catalog    --publishes-->  catalog.video.events     --> catalog.video.events.engagement-reader     --> engagement
#                                                       --> catalog.video.events.search-indexer        --> search
#   engagement --publishes-->  engagement.video.events  --> engagement.video.events.catalog-projector  --> catalog
#   search     --publishes-->  search.video.events      (no subscriber yet)
# A subscription dead-letters into <topic>.dlq after 5 delivery attempts; the framework also
# publishes permanently failing messages there itself, with the reason. The subscriptions of
# one topic share its DLQ topic (as `provision` creates them): each subscription has a keeper
# subscription <subscription>.dlq on it, so that dead letters are retained until an operator
# inspects or republishes them (`courier` CLI). A keeper on a shared DLQ topic receives the dead
# letters of every subscription of that topic; each carries the subscription it came from
# (courier_dlq_subscription, or Pub/Sub's CloudPubSubDeadLetterSourceSubscription).
#
# On GCP the services do not run `provision`: this file creates what it would.

terraform {
  required_version = ">= 1.5"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 5.0"
    }
  }
}

provider "google" {
  project = var.project_id
  region  = var.region
}

data "google_project" "this" {}

locals {
  # The event topics, keyed by the service that publishes each (its outbound topic).
  topics = {
    catalog    = "catalog.video.events"
    engagement = "engagement.video.events"
    search     = "search.video.events"
  }

  # One entry per consumed subscription (<topic>.<service>-<role>): the topic it reads (a key of
  # local.topics) and the service that consumes it. The keys are Terraform addresses and must
  # not change: `catalog` and `engagement` predate the search service and name the publisher of
  # the topic (each topic had one subscription then); renaming them would make Terraform
  # replace those subscriptions, losing their backlog and retained messages, and re-create
  # their IAM bindings. Later entries are keyed by consumer group (<service>_<role>).
  subscriptions = {
    catalog = {
      topic        = "catalog"
      subscription = "catalog.video.events.engagement-reader"
      consumer     = "engagement"
    }
    engagement = {
      topic        = "engagement"
      subscription = "engagement.video.events.catalog-projector"
      consumer     = "catalog"
    }
    search_indexer = {
      topic        = "catalog"
      subscription = "catalog.video.events.search-indexer"
      consumer     = "search"
    }
  }

  # The topics something consumes: each has a dead-letter topic <topic>.dlq, shared by its
  # subscriptions. A topic nobody subscribes to (search.video.events for now) needs none.
  dlq_topics = {
    for k, topic in local.topics : k => topic
    if contains([for s in values(local.subscriptions) : s.topic], k)
  }

  services = toset(["catalog", "engagement", "search"])

  # Google-managed identity that forwards dead letters: it must publish to the DLQ topics and
  # subscribe (ack the forwarded message) on the source subscriptions.
  pubsub_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
}

# --- Pub/Sub -------------------------------------------------------------------------------------

# Each topic's protobuf schema, so Pub/Sub refuses a message that is not the envelope at
# publish. The definitions are framework/courier-proto's envelopes made self-contained (one
# file, one top-level message, no imports), kept wire-compatible by courier-proto's
# tests/pubsub_schemas.rs. The emulator does not implement protobuf schemas (docs/emulator.md):
# `provision` creates topics without one there.
resource "google_pubsub_schema" "events" {
  for_each   = local.topics
  name       = "${each.value}.schema"
  type       = "PROTOCOL_BUFFER"
  definition = file("${path.module}/schemas/${each.value}.proto")
}

resource "google_pubsub_topic" "events" {
  # checkov:skip=CKV_GCP_83:Google-managed encryption at rest is deliberate: a customer-managed key (kms_key_name) adds a Cloud KMS key ring to run, rotate and pay for, and a disabled key stops the pipeline; add kms_key_name where policy requires CMEK (deploy/README.md)
  for_each = local.topics
  name     = each.value

  schema_settings {
    schema   = google_pubsub_schema.events[each.key].id
    encoding = "BINARY"
  }
}

resource "google_pubsub_topic" "dlq" {
  # checkov:skip=CKV_GCP_83:Google-managed encryption at rest is deliberate: a customer-managed key (kms_key_name) adds a Cloud KMS key ring to run, rotate and pay for, and a disabled key stops the pipeline; add kms_key_name where policy requires CMEK (deploy/README.md)
  for_each = local.dlq_topics
  name     = "${each.value}.dlq"
}

resource "google_pubsub_subscription" "events" {
  for_each = local.subscriptions
  name     = each.value.subscription
  topic    = google_pubsub_topic.events[each.value.topic].id

  # Events carry the aggregate id as ordering key: per-aggregate order end to end.
  enable_message_ordering = true
  ack_deadline_seconds    = 60 # = consumer.lease_extension_secs

  # Keep acked messages too, so `courier` offsets reset / replay can Seek back in time.
  retain_acked_messages      = true
  message_retention_duration = var.message_retention_duration

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dlq[each.value.topic].id
    max_delivery_attempts = 5 # = consumer.max_delivery_attempts
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  # Never delete a subscription for inactivity (the default is 31 days).
  expiration_policy {
    ttl = ""
  }
}

# Keeper subscriptions: a topic without a subscription drops what is published to it.
resource "google_pubsub_subscription" "dlq_keeper" {
  for_each = local.subscriptions
  name     = "${each.value.subscription}.dlq"
  topic    = google_pubsub_topic.dlq[each.value.topic].id

  ack_deadline_seconds       = 60
  message_retention_duration = var.message_retention_duration

  expiration_policy {
    ttl = ""
  }
}

# --- Service accounts ----------------------------------------------------------------------------

resource "google_service_account" "service" {
  for_each     = local.services
  account_id   = "courier-${each.key}"
  display_name = "Courier ${each.key} service"
}

# Runs `<service> migrate` (Cloud Run jobs): the only identity that can read the admin URLs.
resource "google_service_account" "migrate" {
  account_id   = "courier-migrate"
  display_name = "Courier database migrations"
}

# Each service publishes its own events topic...
resource "google_pubsub_topic_iam_member" "publisher" {
  for_each = local.topics
  topic    = google_pubsub_topic.events[each.key].id
  role     = "roles/pubsub.publisher"
  member   = "serviceAccount:${google_service_account.service[each.key].email}"
}

# ...consumes the subscription it reads...
resource "google_pubsub_subscription_iam_member" "subscriber" {
  for_each     = local.subscriptions
  subscription = google_pubsub_subscription.events[each.key].id
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${google_service_account.service[each.value.consumer].email}"
}

# ...may look at the metadata of both (publisher/subscriber grant no get)...
resource "google_pubsub_topic_iam_member" "publisher_viewer" {
  for_each = local.topics
  topic    = google_pubsub_topic.events[each.key].id
  role     = "roles/pubsub.viewer"
  member   = "serviceAccount:${google_service_account.service[each.key].email}"
}

resource "google_pubsub_subscription_iam_member" "subscriber_viewer" {
  for_each     = local.subscriptions
  subscription = google_pubsub_subscription.events[each.key].id
  role         = "roles/pubsub.viewer"
  member       = "serviceAccount:${google_service_account.service[each.value.consumer].email}"
}

# ...and publishes dead letters (with their reason) to the DLQ of the subscription it consumes.
resource "google_pubsub_topic_iam_member" "consumer_dlq_publisher" {
  for_each = local.subscriptions
  topic    = google_pubsub_topic.dlq[each.value.topic].id
  role     = "roles/pubsub.publisher"
  member   = "serviceAccount:${google_service_account.service[each.value.consumer].email}"
}

# Pub/Sub's own dead lettering (after max_delivery_attempts) runs as the service agent.
resource "google_pubsub_topic_iam_member" "agent_dlq_publisher" {
  for_each = local.dlq_topics
  topic    = google_pubsub_topic.dlq[each.key].id
  role     = "roles/pubsub.publisher"
  member   = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "agent_subscriber" {
  for_each     = local.subscriptions
  subscription = google_pubsub_subscription.events[each.key].id
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

# Operators: read the DLQ keepers, republish to the source topics (courier CLI).
resource "google_pubsub_subscription_iam_member" "operator_dlq" {
  for_each = {
    for pair in setproduct(keys(local.subscriptions), var.operators) : "${pair[0]}/${pair[1]}" => {
      stream = pair[0]
      member = pair[1]
    }
  }
  subscription = google_pubsub_subscription.dlq_keeper[each.value.stream].id
  role         = "roles/pubsub.subscriber"
  member       = each.value.member
}

# A dead letter comes from a consumed topic, so only those are republished to.
resource "google_pubsub_topic_iam_member" "operator_republish" {
  for_each = {
    for pair in setproduct(keys(local.dlq_topics), var.operators) : "${pair[0]}/${pair[1]}" => {
      stream = pair[0]
      member = pair[1]
    }
  }
  topic  = google_pubsub_topic.events[each.value.stream].id
  role   = "roles/pubsub.publisher"
  member = each.value.member
}

# Cloud Run's cloudsql-instances connector needs Cloud SQL Client (project-level role).
resource "google_project_iam_member" "cloudsql_client" {
  for_each = merge(
    { for s in local.services : s => "serviceAccount:${google_service_account.service[s].email}" },
    { migrate = "serviceAccount:${google_service_account.migrate.email}" },
  )
  project = var.project_id
  role    = "roles/cloudsql.client"
  member  = each.value
}

# GKE: the Kubernetes service account courier/<service> acts as courier-<service>.
resource "google_service_account_iam_member" "workload_identity" {
  for_each           = var.gke_workload_identity ? local.services : toset([])
  service_account_id = google_service_account.service[each.key].name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.k8s_namespace}/${each.key}]"
}

# --- Secrets (values are added out of band: gcloud secrets versions add NAME --data-file=-) ------

# The service's own role: COURIER_DATABASE__URL of `<service> serve`.
resource "google_secret_manager_secret" "database_url" {
  for_each  = local.services
  secret_id = "${each.key}-database-url"
  replication {
    auto {}
  }
}

# A role that may create roles and schemas: COURIER_DATABASE__ADMIN_URL of `<service> migrate`.
resource "google_secret_manager_secret" "database_admin_url" {
  for_each  = local.services
  secret_id = "${each.key}-database-admin-url"
  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_iam_member" "database_url" {
  for_each  = local.services
  secret_id = google_secret_manager_secret.database_url[each.key].id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.service[each.key].email}"
}

resource "google_secret_manager_secret_iam_member" "database_admin_url" {
  for_each  = local.services
  secret_id = google_secret_manager_secret.database_admin_url[each.key].id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.migrate.email}"
}

# --- Images and callers --------------------------------------------------------------------------

resource "google_artifact_registry_repository" "courier" {
  # checkov:skip=CKV_GCP_84:Google-managed encryption at rest is deliberate: the repository holds only the images built from this source, no user data; a customer-managed key (kms_key_name) adds a Cloud KMS key to run and pay for; add it where policy requires CMEK (deploy/README.md)
  location      = var.region
  repository_id = "courier"
  format        = "DOCKER"
  description   = "Courier images (deploy/Dockerfile)"
}

# Cloud Run: callers authenticate with an identity token and need roles/run.invoker; that is
# why http.auth_token stays unset there. Example:
#   cloud_run_invokers = { catalog = ["serviceAccount:frontend@my-project.iam.gserviceaccount.com"] }
resource "google_cloud_run_v2_service_iam_member" "invoker" {
  for_each = {
    for pair in flatten([
      for service, members in var.cloud_run_invokers : [
        for member in members : { service = service, member = member }
      ]
    ]) : "${pair.service}/${pair.member}" => pair
  }
  project  = var.project_id
  location = var.region
  name     = each.value.service
  role     = "roles/run.invoker"
  member   = each.value.member
}
