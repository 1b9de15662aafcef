"""specopd_trainer: collects supervision from a live SGLang server and trains DFlash-family drafters."""
