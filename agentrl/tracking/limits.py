"""MLflow's size limits on what a run holds, in one place (its REST API refuses longer values)."""

TAG_VALUE_CHARS = 8000  # a tag's value (mlflow.utils.validation's MAX_TAG_VAL_LENGTH)
PARAM_VALUE_CHARS = 6000  # a param's value (MAX_PARAM_VAL_LENGTH)
PARAMS_PER_BATCH = 100  # params in one log-batch call
METRICS_PER_BATCH = 1000  # metrics in one log-batch call
