"""Float64 checks of the seeds' statements that no chapter's experiment decides: identities,
bounds, costs and small counterexamples read off the seeds' text, one module per part of the
register (``riemannian_a``: the abstract and Sections 1-3 of the Riemannian paper;
``riemannian_b``: Sections 4-5; ``riemannian_c``: Sections 6-8; ``cards``: the matroidal,
cofactor and structured-masked-attention seeds). Each module's ``outcomes(smoke=False) ->
{claim key: Outcome}`` runs in well under a second; chapter 10 shows them with the register."""
